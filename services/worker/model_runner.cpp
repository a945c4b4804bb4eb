#include "services/worker/model_runner.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "services/worker/checkpoint.h"
#include "services/worker/cpu_model_runner.h"
#ifdef LITELLAMA_WITH_CUDA
#include "services/worker/cuda/cuda_model_runner.h"
#endif

namespace litellama {

void StepBatch::add_sequence(std::span<const int32_t> new_tokens, std::span<const int32_t> slots,
                             bool sample_token, const SamplingParams& params,
                             int32_t n_generated_so_far) {
  if (token_start.empty()) token_start.push_back(0);
  if (slot_start.empty()) slot_start.push_back(0);
  const auto n_kv = static_cast<int32_t>(slots.size());
  const auto n_new = static_cast<int32_t>(new_tokens.size());
  for (int32_t i = 0; i < n_new; ++i) {
    token_ids.push_back(new_tokens[static_cast<size_t>(i)]);
    positions.push_back(n_kv - n_new + i);
  }
  token_start.push_back(static_cast<int32_t>(token_ids.size()));
  kv_len.push_back(n_kv);
  slot_table.insert(slot_table.end(), slots.begin(), slots.end());
  slot_start.push_back(static_cast<int32_t>(slot_table.size()));
  sample.push_back(sample_token ? 1 : 0);
  sampling.push_back(params);
  n_generated.push_back(n_generated_so_far);
  if (!history_start.empty()) history_start.push_back(history_start.back());
  if (!n_prompt.empty()) n_prompt.push_back(0);
}

void StepBatch::set_history(std::span<const int32_t> prompt_ids,
                            std::span<const int32_t> generated_ids) {
  const size_t n = kv_len.size();
  // History arrays are created lazily, covering every sequence added so far.
  if (history_start.empty()) history_start.assign(n + 1, 0);
  if (n_prompt.empty()) n_prompt.assign(n, 0);
  history_ids.insert(history_ids.end(), prompt_ids.begin(), prompt_ids.end());
  history_ids.insert(history_ids.end(), generated_ids.begin(), generated_ids.end());
  history_start[n] = static_cast<int32_t>(history_ids.size());
  n_prompt[n - 1] = static_cast<int32_t>(prompt_ids.size());
}

void StepBatch::clear() {
  token_ids.clear();
  positions.clear();
  token_start.clear();
  kv_len.clear();
  slot_start.clear();
  slot_table.clear();
  sample.clear();
  sampling.clear();
  n_generated.clear();
  history_start.clear();
  history_ids.clear();
  n_prompt.clear();
  n_top_logits = 0;
  embed_token_index.clear();
  embed_row_index.clear();
  embed_rows = nullptr;
  embed_rows_memory = EmbeddingMemory::kHost;
  logprobs = false;
}

StepBatchView StepBatch::view() const {
  // Every sequence's whole table, at the prefix sums: slot_start[0 .. n) are the bases, and all
  // n + 1 entries delimit new_slots.
  const size_t n = slot_start.empty() ? 0 : kv_len.size();
  return StepBatchView{.token_ids = token_ids,
                       .positions = positions,
                       .token_start = token_start,
                       .kv_len = kv_len,
                       .slot_start = std::span<const int32_t>(slot_start).first(n),
                       .new_slot_start = slot_start,
                       .new_slots = slot_table,
                       .sample = sample,
                       .sampling = sampling,
                       .n_generated = n_generated,
                       .history_start = history_start,
                       .history_ids = history_ids,
                       .n_prompt = n_prompt,
                       .n_top_logits = n_top_logits,
                       .embed_token_index = embed_token_index,
                       .embed_row_index = embed_row_index,
                       .embed_rows = embed_rows,
                       .embed_rows_memory = embed_rows_memory,
                       .logprobs = logprobs};
}

namespace {

// The first value of v outside [0, limit), or null. The common case (all in range) is one
// branch-free pass that the compiler vectorizes (a step that brings whole tables carries a slot
// per key of every sequence), since an early-exit loop does not vectorize.
const int32_t* first_outside(std::span<const int32_t> v, int32_t limit) {
  uint32_t any = 0;
  for (const int32_t x : v) any |= static_cast<uint32_t>(x < 0) | static_cast<uint32_t>(x >= limit);
  if (any == 0) return nullptr;
  return &*std::find_if(v.begin(), v.end(), [&](int32_t x) { return x < 0 || x >= limit; });
}

// The per-sequence checks of StepBatchView::validate for sequence s.
Status validate_sequence(const StepBatchView& b, size_t s, int64_t table_capacity) {
  const int32_t n_new = b.token_start[s + 1] - b.token_start[s];
  if (n_new < 1)
    return make_error(StatusCode::kInvalidArgument, "sequence {} brings no new token", s);
  const int32_t n_written = b.new_slot_start[s + 1] - b.new_slot_start[s];
  if (b.kv_len[s] < n_new || n_written < 0 || n_written > b.kv_len[s]) {
    return make_error(StatusCode::kInvalidArgument,
                      "sequence {}: {} new table entries for kv_len {} and {} new tokens", s,
                      n_written, b.kv_len[s], n_new);
  }
  if (b.slot_start[s] < 0 || int64_t{b.slot_start[s]} + b.kv_len[s] > table_capacity) {
    return make_error(StatusCode::kInvalidArgument,
                      "sequence {}: table entries {} .. {} are outside the slot table ({})", s,
                      b.slot_start[s], int64_t{b.slot_start[s]} + b.kv_len[s], table_capacity);
  }
  for (int32_t i = 0; i < n_new; ++i) {
    if (b.positions[static_cast<size_t>(b.token_start[s] + i)] != b.kv_len[s] - n_new + i) {
      return make_error(StatusCode::kInvalidArgument,
                        "sequence {}: positions must be kv_len - n_new .. kv_len - 1", s);
    }
  }
  if (!b.history_start.empty()) {
    if (b.history_start[s + 1] < b.history_start[s] || b.n_prompt[s] < 0 ||
        b.n_prompt[s] > b.history_start[s + 1] - b.history_start[s]) {
      return make_error(StatusCode::kInvalidArgument, "sequence {}: bad penalty history", s);
    }
  } else if (b.sample[s] && b.sampling[s].has_penalties()) {
    return make_error(StatusCode::kInvalidArgument,
                      "sequence {} uses penalties but the batch carries no history", s);
  }
  const SamplingParams& p = b.sampling[s];
  if (!(p.temperature >= 0) || p.top_k < 0 || !(p.top_p > 0 && p.top_p <= 1) ||
      !(p.min_p >= 0 && p.min_p <= 1) || !(p.repetition_penalty > 0)) {
    return make_error(StatusCode::kInvalidArgument, "sequence {}: sampling parameters out of range",
                      s);
  }
  return Status::ok();
}

Status validate_embedding_rows(const StepBatchView& b) {
  if (b.embed_token_index.empty()) {
    if (!b.embed_row_index.empty()) {
      return make_error(StatusCode::kInvalidArgument,
                        "step batch has {} embedding row indices but no embedded tokens",
                        b.embed_row_index.size());
    }
    return Status::ok();
  }
  if (!b.embed_row_index.empty()) {
    if (b.embed_row_index.size() != b.embed_token_index.size()) {
      return make_error(StatusCode::kInvalidArgument,
                        "step batch has {} embedding row indices for {} embedded tokens",
                        b.embed_row_index.size(), b.embed_token_index.size());
    }
    for (size_t j = 0; j < b.embed_row_index.size(); ++j) {
      if (b.embed_row_index[j] < 0) {
        return make_error(StatusCode::kInvalidArgument,
                          "step batch embedding row index {} at {} is negative",
                          b.embed_row_index[j], j);
      }
    }
  }
  if (b.embed_rows == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "step batch names {} embedding rows but gives none",
                      b.embed_token_index.size());
  }
  for (size_t j = 0; j < b.embed_token_index.size(); ++j) {
    const int32_t t = b.embed_token_index[j];
    if (t < 0 || t >= b.n_tokens() || (j > 0 && t <= b.embed_token_index[j - 1])) {
      return make_error(StatusCode::kInvalidArgument,
                        "step batch embedding token index {} at {} is out of range or not "
                        "increasing",
                        t, j);
    }
  }
  return Status::ok();
}

}  // namespace

Status check_kv_slots(std::span<const int32_t> slots, int32_t n_kv_slots) {
  if (const int32_t* bad = first_outside(slots, n_kv_slots)) {
    return make_error(StatusCode::kInvalidArgument, "KV slot {} is outside the pool (size {})",
                      *bad, n_kv_slots);
  }
  return Status::ok();
}

Status StepBatchView::validate(int32_t n_kv_slots, int32_t vocab_size, int64_t table_capacity,
                               bool check_slots) const {
  const size_t n = kv_len.size();
  if (n == 0) return make_error(StatusCode::kInvalidArgument, "step batch has no sequences");
  if (token_start.size() != n + 1 || slot_start.size() != n || new_slot_start.size() != n + 1 ||
      sample.size() != n || sampling.size() != n || n_generated.size() != n) {
    return make_error(StatusCode::kInvalidArgument,
                      "step batch per-sequence arrays disagree in length");
  }
  if (positions.size() != token_ids.size()) {
    return make_error(StatusCode::kInvalidArgument,
                      "step batch positions and token ids differ in length");
  }
  if (token_start[0] != 0 || new_slot_start[0] != 0 ||
      token_start[n] != static_cast<int32_t>(token_ids.size()) ||
      new_slot_start[n] != static_cast<int32_t>(new_slots.size())) {
    return make_error(StatusCode::kInvalidArgument, "step batch offsets do not cover the arrays");
  }
  if (!history_start.empty() &&
      (history_start.size() != n + 1 || n_prompt.size() != n || history_start[0] != 0 ||
       history_start[n] != static_cast<int32_t>(history_ids.size()))) {
    return make_error(StatusCode::kInvalidArgument, "step batch history arrays are inconsistent");
  }
  LITELLAMA_RETURN_IF_ERROR(validate_embedding_rows(*this));
  if (n_top_logits < 0 || n_top_logits > vocab_size) {
    return make_error(StatusCode::kInvalidArgument, "n_top_logits {} out of range", n_top_logits);
  }
  for (size_t s = 0; s < n; ++s)
    LITELLAMA_RETURN_IF_ERROR(validate_sequence(*this, s, table_capacity));
  if (const int32_t* bad = first_outside(token_ids, vocab_size)) {
    return make_error(StatusCode::kInvalidArgument,
                      "token id {} is outside the vocabulary (size {})", *bad, vocab_size);
  }
  if (const int32_t* bad = first_outside(history_ids, vocab_size)) {
    return make_error(StatusCode::kInvalidArgument, "history token id {} is outside the vocabulary",
                      *bad);
  }
  return check_slots ? check_kv_slots(new_slots, n_kv_slots) : Status::ok();
}

int64_t default_slot_table_capacity(int32_t n_kv_slots, int32_t max_batch_seqs) {
  // Table indices travel as int32 (StepBatchView::slot_start, the step ring).
  return std::min<int64_t>(4 * int64_t{n_kv_slots} + 16 * int64_t{max_batch_seqs}, INT32_MAX);
}

// Where the default GEMV limits change: Llama-3.2-1B (hidden 2048) and Qwen2.5-1.5B (1536) on one
// side, Llama-3.1-8B (4096) on the other.
constexpr int32_t kSmallModelMaxHidden = 2048;

Result<DType> resolve_compute_dtype(Device device, std::string_view requested,
                                    DType checkpoint_dtype) {
  if (requested.empty() || requested == "auto") {
    if (device == Device::kCpu) return DType::kF32;
    return checkpoint_dtype == DType::kF16 ? DType::kF16 : DType::kBF16;
  }
  const std::optional<DType> dtype = dtype_from_torch_name(requested);
  if (!dtype) {
    return make_error(StatusCode::kInvalidArgument,
                      "unknown dtype '{}' (auto, float32, bfloat16 or float16)", requested);
  }
  return *dtype;
}

Result<LayerKernelRepeats> parse_layer_kernel_repeats(std::string_view spec) {
  LayerKernelRepeats r;
  const std::pair<std::string_view, int32_t LayerKernelRepeats::*> fields[] = {
      {"qkv", &LayerKernelRepeats::qkv},
      {"attention", &LayerKernelRepeats::attention},
      {"o", &LayerKernelRepeats::o},
      {"post_norm", &LayerKernelRepeats::post_norm},
      {"gate_up", &LayerKernelRepeats::gate_up},
      {"down", &LayerKernelRepeats::down}};
  std::vector<std::string_view> seen;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view count = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    const auto* field = std::find_if(std::begin(fields), std::end(fields),
                                     [&](const auto& f) { return f.first == name; });
    if (field == std::end(fields)) {
      return make_error(StatusCode::kInvalidArgument,
                        "kernel repeats: unknown kernel '{}' in '{}' (qkv, attention, o, "
                        "post_norm, gate_up, down)",
                        name, item);
    }
    if (count.size() != 1 || count[0] < '0' || count[0] > '2') {
      return make_error(StatusCode::kInvalidArgument,
                        "kernel repeats: '{}' needs a count of 0, 1 or 2 (name=count)", item);
    }
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      return make_error(StatusCode::kInvalidArgument, "kernel repeats: '{}' given twice", name);
    }
    seen.push_back(name);
    r.*(field->second) = count[0] - '0';
  }
  return r;
}

int32_t resolved_gemv_max_tokens(const RunnerOptions& options, int32_t hidden_size) {
  // The GEMV layers beat cuBLAS up to batch 8 for small models and up to batch 4 for larger ones
  // (RunnerOptions::gemv_max_tokens).
  if (options.gemv_max_tokens >= 0) return options.gemv_max_tokens;
  return hidden_size <= kSmallModelMaxHidden ? 8 : 4;
}

int32_t resolved_gemv_gate_up_max_tokens(const RunnerOptions& options, int32_t hidden_size) {
  // The same limits as the other GEMV layers: past batch 4 a larger model's gate/up gains nothing
  // over cuBLAS alone and loses together with the other GEMV layers.
  if (options.gemv_gate_up_max_tokens >= 0) return options.gemv_gate_up_max_tokens;
  return hidden_size <= kSmallModelMaxHidden ? 8 : 4;
}

Result<std::unique_ptr<ModelRunner>> create_model_runner(const Checkpoint& checkpoint,
                                                         const RunnerOptions& options) {
  switch (options.device) {
    case Device::kCpu:
      return create_cpu_model_runner(checkpoint, options);
    case Device::kCuda:
#ifdef LITELLAMA_WITH_CUDA
      return create_cuda_model_runner(checkpoint, options);
#else
      return make_error(StatusCode::kUnsupported,
                        "this build has no CUDA backend (configure with nvcc present or "
                        "-DLITELLAMA_CUDA=ON)");
#endif
  }
  return make_error(StatusCode::kInvalidArgument, "unknown device");
}

}  // namespace litellama
