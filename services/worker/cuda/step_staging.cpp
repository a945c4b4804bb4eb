#include "services/worker/cuda/step_staging.h"

#include <algorithm>
#include <cstring>

#include "kernels/sampling.h"
#include "services/worker/cuda/device_buffer.h"
#include "services/worker/rope_scaling.h"

namespace litellama {

namespace {

constexpr size_t kAlign = 16;

class Packer {
 public:
  size_t take(size_t bytes) {
    const size_t at = next_;
    next_ = align_up(next_ + bytes, kAlign);
    return at;
  }
  size_t total() const { return next_; }

 private:
  size_t next_ = 0;
};

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// Copies src into dst (when not null) and returns whether every value is in [0, limit): one
// branch-free pass that the compiler vectorizes (a step that brings whole tables carries a slot
// per key of every sequence).
bool copy_in_range(int32_t* dst, std::span<const int32_t> src, int32_t limit) {
  uint32_t outside = 0;
  const size_t n = src.size();
  const int32_t* in = src.data();
  if (dst == nullptr) {
    for (size_t i = 0; i < n; ++i) {
      outside |= static_cast<uint32_t>(in[i] < 0) | static_cast<uint32_t>(in[i] >= limit);
    }
    return outside == 0;
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t x = in[i];
    dst[i] = x;
    outside |= static_cast<uint32_t>(x < 0) | static_cast<uint32_t>(x >= limit);
  }
  return outside == 0;
}

}  // namespace

StepPlan plan_step(const StepBatchView& batch, const ModelConfig& config) {
  StepPlan plan;
  plan.n_tokens = batch.n_tokens();
  plan.n_seqs = batch.n_seqs();
  plan.dynamic_rope = config.rope.type == RopeScalingType::kDynamic;
  plan.logprobs = batch.logprobs;
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t n_new = batch.token_start[s + 1] - batch.token_start[s];
    if (n_new == 1) {
      ++plan.n_decode;
      plan.max_decode_kv_len = std::max(plan.max_decode_kv_len, batch.kv_len[s]);
    } else {
      ++plan.n_prefill;
      plan.max_prefill_n_new = std::max(plan.max_prefill_n_new, n_new);
    }
    if (batch.sample[s]) {
      plan.sampled_seqs.push_back(s);
      const SamplingParams& sp = batch.sampling[static_cast<size_t>(s)];
      plan.greedy_only = plan.greedy_only && sp.is_greedy() && !sp.has_penalties();
    }
  }

  const size_t n_tok = static_cast<size_t>(plan.n_tokens);
  const size_t n_seq = static_cast<size_t>(plan.n_seqs);
  const size_t i32 = sizeof(int32_t);
  Packer p;
  StepLayout& l = plan.layout;
  l.token_ids = p.take(n_tok * i32);
  l.positions = p.take(n_tok * i32);
  l.token_slot = p.take(n_tok * i32);
  l.token_freq_row = p.take(plan.dynamic_rope ? n_tok * i32 : 0);
  l.token_start = p.take((n_seq + 1) * i32);
  l.kv_len = p.take(n_seq * i32);
  l.slot_start = p.take(n_seq * i32);
  l.new_slot_start = p.take((n_seq + 1) * i32);
  l.work_seqs = p.take(n_seq * i32);
  l.sample_rows = p.take(n_seq * i32);
  l.sampling_rows = p.take(n_seq * sizeof(SamplingRow));
  l.freq_table = p.take(plan.dynamic_rope
                            ? (n_seq + 1) * static_cast<size_t>(config.head_dim / 2) * sizeof(float)
                            : 0);
  // Past the fixed part: only prefill steps carry embedding rows, and no graph runs them.
  plan.n_embed = static_cast<int32_t>(batch.embed_token_index.size());
  plan.embed_rows = batch.embed_rows;
  l.embed_index = p.take(static_cast<size_t>(plan.n_embed) * i32);
  // Last, so that new slots copied from where they lie leave one contiguous range to stage.
  plan.n_new_slots = static_cast<int32_t>(batch.new_slots.size());
  l.new_slots = p.take(batch.new_slots.size() * i32);
  l.total_bytes = p.total();
  return plan;
}

Status fill_step(const StepBatchView& batch, const ModelConfig& config, const StepPlan& plan,
                 int32_t n_kv_slots, bool copy_new_slots, int32_t* table, void* host) {
  const StepLayout& l = plan.layout;
  if (!copy_in_range(copy_new_slots ? at<int32_t>(host, l.new_slots) : nullptr, batch.new_slots,
                     n_kv_slots)) {
    return check_kv_slots(batch.new_slots, n_kv_slots);  // names the first bad slot
  }
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t n_w = batch.new_slot_start[s + 1] - batch.new_slot_start[s];
    std::copy_n(batch.new_slots.begin() + batch.new_slot_start[s], n_w,
                table + batch.slot_start[s] + batch.kv_len[s] - n_w);
  }
  auto copy = [&](size_t offset, std::span<const int32_t> v) {
    if (!v.empty()) std::memcpy(at<char>(host, offset), v.data(), v.size() * sizeof(int32_t));
  };
  copy(l.token_ids, batch.token_ids);
  copy(l.positions, batch.positions);
  copy(l.token_start, batch.token_start);
  copy(l.kv_len, batch.kv_len);
  copy(l.slot_start, batch.slot_start);
  copy(l.new_slot_start, batch.new_slot_start);
  copy(l.embed_index, batch.embed_token_index);

  auto* token_slot = at<int32_t>(host, l.token_slot);
  auto* work = at<int32_t>(host, l.work_seqs);
  int32_t n_decode = 0, n_prefill = 0;
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t begin = batch.token_start[s], end = batch.token_start[s + 1];
    for (int32_t t = begin; t < end; ++t) {
      token_slot[t] = table[batch.slot_start[s] + batch.positions[t]];
    }
    if (end - begin == 1) {
      work[n_decode++] = s;
    } else {
      work[plan.n_decode + n_prefill++] = s;
    }
  }

  if (plan.dynamic_rope) {
    // Row 0: the base table; a sequence past the original context gets a row of its own.
    const size_t half = static_cast<size_t>(config.head_dim / 2);
    auto* table = at<float>(host, l.freq_table);
    auto* token_row = at<int32_t>(host, l.token_freq_row);
    const std::vector<float> base = rope_inv_freq(config, 0);
    std::copy(base.begin(), base.end(), table);
    int32_t n_rows = 1;
    for (int32_t s = 0; s < plan.n_seqs; ++s) {
      int32_t row = 0;
      if (rope_dynamic_base(config, batch.kv_len[s]) != config.rope.theta) {
        const std::vector<float> inv = rope_inv_freq(config, batch.kv_len[s]);
        std::copy(inv.begin(), inv.end(), table + static_cast<size_t>(n_rows) * half);
        row = n_rows++;
      }
      for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) token_row[t] = row;
    }
  }

  auto* sample_rows = at<int32_t>(host, l.sample_rows);
  auto* sampling_rows = at<SamplingRow>(host, l.sampling_rows);
  const bool has_history = !batch.history_start.empty();
  for (size_t r = 0; r < plan.sampled_seqs.size(); ++r) {
    const int32_t s = plan.sampled_seqs[r];
    const SamplingParams& sp = batch.sampling[static_cast<size_t>(s)];
    sample_rows[r] = batch.token_start[s + 1] - 1;
    SamplingRow row;
    row.params = sp;
    row.n_generated = batch.n_generated[static_cast<size_t>(s)];
    if (has_history) {
      row.history_begin = batch.history_start[s];
      row.history_end = batch.history_start[s + 1];
      row.n_prompt = batch.n_prompt[static_cast<size_t>(s)];
    }
    sampling_rows[r] = row;
  }
  return Status::ok();
}

}  // namespace litellama
