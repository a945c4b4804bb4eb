#include "services/worker/cpu_model_runner.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "services/worker/checkpoint.h"
#include "services/worker/cpu_sampler.h"
#include "services/worker/rope_scaling.h"

namespace litellama {

namespace {

// Below this many multiply-adds an op runs on one thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

// Full-length sequences the default KV pool holds (when --kv-slots is 0), within
// RunnerOptions::kv_memory_bytes.
constexpr int64_t kDefaultKvContexts = 4;

// Zero-filled memory straight from the kernel, mapped page by page on first touch: a large KV pool
// costs nothing at start-up, and only as much memory as the slots in use (the scheduler's
// allocator hands out low slots first) instead of its full size.
class LazyZeroBuffer {
 public:
  LazyZeroBuffer() = default;
  static Result<LazyZeroBuffer> allocate(size_t n_floats) {
    LazyZeroBuffer b;
    b.bytes_ = std::max<size_t>(n_floats, 1) * sizeof(float);
    void* p = mmap(nullptr, b.bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return make_error(StatusCode::kResourceExhausted, "cannot map {} bytes for the KV pool",
                        b.bytes_);
    }
    b.data_ = static_cast<float*>(p);
    return b;
  }
  LazyZeroBuffer(LazyZeroBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  LazyZeroBuffer& operator=(LazyZeroBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~LazyZeroBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

struct CpuLayer {
  std::vector<float> input_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo;
  std::vector<float> post_norm, w_gate, w_up, w_down;
};

class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(ModelConfig config, int32_t n_slots, int32_t n_threads, int64_t table_capacity)
      : config_(std::move(config)),
        n_slots_(n_slots),
        n_threads_(n_threads),
        table_capacity_(table_capacity) {}

  Status load(const Checkpoint& ckpt);
  void set_observer(ActivationObserver observer) { observer_ = std::move(observer); }

  const ModelConfig& config() const override { return config_; }
  int32_t n_kv_slots() const override { return n_slots_; }
  int64_t weight_bytes() const override {
    size_t floats = embed_.size() + final_norm_.size() + lm_head_.size();
    for (const CpuLayer& L : layers_) {
      for (const auto* v : {&L.input_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.q_norm,
                            &L.k_norm, &L.wo, &L.post_norm, &L.w_gate, &L.w_up, &L.w_down}) {
        floats += v->size();
      }
    }
    return static_cast<int64_t>(floats * sizeof(float));
  }
  int64_t slot_table_capacity() const override { return table_capacity_; }
  Status step(const StepBatchView& batch, StepOutput* out) override;
  // The CPU runner has one path for every batch.
  std::string explain_step(const StepBatchView& batch) const override {
    return fmt::format(
        "float32 reference forward pass over {} tokens in {} sequences on {} threads (one path "
        "for every batch), then the CPU sampler\n",
        batch.n_tokens(), batch.n_seqs(), n_threads_);
  }
  bool supports_input_embeddings(EmbeddingMemory memory) const override {
    return memory == EmbeddingMemory::kHost;
  }

 private:
  // out[t, n] = sum_k in[t, k] * w[n, k] (+ bias[n])
  void linear(float* out, const float* in, const float* w, const float* bias, int64_t n_rows,
              int64_t n_out, int64_t n_in) const;
  void rms_norm(float* out, const float* in, const float* weight, int64_t n_rows,
                int64_t dim) const;
  void attention(float* out, const float* q, int32_t layer, const StepBatchView& batch) const;
  // Writes the step's new slot-table entries (after validation).
  void write_slot_table(const StepBatchView& batch);

  ModelConfig config_;
  int32_t n_slots_;
  int32_t n_threads_;
  int64_t table_capacity_;
  // The slot table; grown on demand up to table_capacity_ (entries past its size are unwritten).
  std::vector<int32_t> table_;
  std::vector<CpuLayer> layers_;
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<LazyZeroBuffer> k_pool_, v_pool_;      // [layer][n_slots, n_kv_heads, head_dim]
  ActivationObserver observer_;                      // empty unless calibrating
};

Status CpuModelRunner::load(const Checkpoint& ckpt) {
  auto get = [&](const std::string& name, std::vector<float>* dst) -> Status {
    LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name));
    *dst = t.to_f32();
    return Status::ok();
  };
  LITELLAMA_RETURN_IF_ERROR(get(ckpt.embed_name(), &embed_));
  LITELLAMA_RETURN_IF_ERROR(get(ckpt.final_norm_name(), &final_norm_));
  if (!config_.tie_word_embeddings) LITELLAMA_RETURN_IF_ERROR(get(ckpt.lm_head_name(), &lm_head_));
  layers_.resize(static_cast<size_t>(config_.n_layers));
  for (int32_t l = 0; l < config_.n_layers; ++l) {
    const LayerTensorNames n = ckpt.layer_names(l);
    CpuLayer& L = layers_[static_cast<size_t>(l)];
    LITELLAMA_RETURN_IF_ERROR(get(n.input_norm, &L.input_norm));
    LITELLAMA_ASSIGN_OR_RETURN(L.wq, ckpt.linear_f32(n.q));
    LITELLAMA_ASSIGN_OR_RETURN(L.wk, ckpt.linear_f32(n.k));
    LITELLAMA_ASSIGN_OR_RETURN(L.wv, ckpt.linear_f32(n.v));
    LITELLAMA_ASSIGN_OR_RETURN(L.wo, ckpt.linear_f32(n.o));
    if (config_.qkv_bias) {
      LITELLAMA_RETURN_IF_ERROR(get(n.q_bias, &L.bq));
      LITELLAMA_RETURN_IF_ERROR(get(n.k_bias, &L.bk));
      LITELLAMA_RETURN_IF_ERROR(get(n.v_bias, &L.bv));
    }
    if (config_.qk_norm) {
      LITELLAMA_RETURN_IF_ERROR(get(n.q_norm, &L.q_norm));
      LITELLAMA_RETURN_IF_ERROR(get(n.k_norm, &L.k_norm));
    }
    LITELLAMA_RETURN_IF_ERROR(get(n.post_attention_norm, &L.post_norm));
    LITELLAMA_ASSIGN_OR_RETURN(L.w_gate, ckpt.linear_f32(n.gate));
    LITELLAMA_ASSIGN_OR_RETURN(L.w_up, ckpt.linear_f32(n.up));
    LITELLAMA_ASSIGN_OR_RETURN(L.w_down, ckpt.linear_f32(n.down));
  }
  const size_t pool = static_cast<size_t>(n_slots_) * config_.n_kv_heads * config_.head_dim;
  k_pool_.clear();
  v_pool_.clear();
  for (int32_t l = 0; l < config_.n_layers; ++l) {
    LITELLAMA_ASSIGN_OR_RETURN(LazyZeroBuffer k, LazyZeroBuffer::allocate(pool));
    LITELLAMA_ASSIGN_OR_RETURN(LazyZeroBuffer v, LazyZeroBuffer::allocate(pool));
    k_pool_.push_back(std::move(k));
    v_pool_.push_back(std::move(v));
  }
  return Status::ok();
}

void CpuModelRunner::linear(float* out, const float* in, const float* w, const float* bias,
                            int64_t n_rows, int64_t n_out, int64_t n_in) const {
  // Four rows share each pass over a weight row, so weights stream once per four tokens.
  constexpr int64_t kRowBlock = 4;
  // Small products run on one thread: a parallel region costs more than it saves there, and
  // much more on a loaded machine where worker threads wait to be scheduled.
  const bool parallel = n_rows * n_out * n_in >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (parallel)
  for (int64_t n = 0; n < n_out; ++n) {
    const float* wr = w + n * n_in;
    const float b = bias ? bias[n] : 0.0f;
    int64_t t = 0;
    for (; t + kRowBlock <= n_rows; t += kRowBlock) {
      const float* x0 = in + t * n_in;
      const float* x1 = x0 + n_in;
      const float* x2 = x1 + n_in;
      const float* x3 = x2 + n_in;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t k = 0; k < n_in; ++k) {
        a0 += x0[k] * wr[k];
        a1 += x1[k] * wr[k];
        a2 += x2[k] * wr[k];
        a3 += x3[k] * wr[k];
      }
      out[t * n_out + n] = a0 + b;
      out[(t + 1) * n_out + n] = a1 + b;
      out[(t + 2) * n_out + n] = a2 + b;
      out[(t + 3) * n_out + n] = a3 + b;
    }
    for (; t < n_rows; ++t) {
      const float* x = in + t * n_in;
      float a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t k = 0; k < n_in; ++k) a += x[k] * wr[k];
      out[t * n_out + n] = a + b;
    }
  }
}

void CpuModelRunner::rms_norm(float* out, const float* in, const float* weight, int64_t n_rows,
                              int64_t dim) const {
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* x = in + t * dim;
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[t * dim + i] = weight[i] * (x[i] * inv);
  }
}

void CpuModelRunner::attention(float* out, const float* q, int32_t layer,
                               const StepBatchView& batch) const {
  const int32_t n_heads = config_.n_heads, n_kv = config_.n_kv_heads, hd = config_.head_dim;
  const int32_t group = n_heads / n_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* kp = k_pool_[static_cast<size_t>(layer)].data();
  const float* vp = v_pool_[static_cast<size_t>(layer)].data();
  const int64_t n_tokens = batch.n_tokens();
  // Sequence of each token, for the flat (token, head) loop.
  std::vector<int32_t> seq_of(static_cast<size_t>(n_tokens));
  for (int32_t s = 0; s < batch.n_seqs(); ++s) {
    for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) seq_of[t] = s;
  }
  int64_t n_pairs = 0;  // (query, key) dot products of this step
  for (int64_t t = 0; t < n_tokens; ++t) n_pairs += batch.positions[t] + 1;
  const bool parallel = n_pairs * n_heads * hd >= kMinParallelMacs;
#pragma omp parallel num_threads(n_threads_) if (parallel)
  {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(hd));
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int32_t h = 0; h < n_heads; ++h) {
        const int32_t s = seq_of[static_cast<size_t>(t)];
        const int32_t pos = batch.positions[static_cast<size_t>(t)];
        const int32_t* slots = table_.data() + batch.slot_start[s];
        const int32_t kvh = h / group;
        const float* qv = q + (t * n_heads + h) * hd;
        scores.resize(static_cast<size_t>(pos) + 1);
        float max_score = -INFINITY;
        for (int32_t j = 0; j <= pos; ++j) {
          const float* kv = kp + (static_cast<int64_t>(slots[j]) * n_kv + kvh) * hd;
          float dot = 0;
          for (int32_t i = 0; i < hd; ++i) dot += qv[i] * kv[i];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float total = 0;
        for (int32_t j = 0; j <= pos; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          total += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int32_t j = 0; j <= pos; ++j) {
          const float* vv = vp + (static_cast<int64_t>(slots[j]) * n_kv + kvh) * hd;
          const float p = scores[j] / total;
          for (int32_t i = 0; i < hd; ++i) acc[i] += p * vv[i];
        }
        std::copy(acc.begin(), acc.end(), out + (t * n_heads + h) * hd);
      }
    }
  }
}

void CpuModelRunner::write_slot_table(const StepBatchView& batch) {
  int64_t end = 0;
  for (int32_t s = 0; s < batch.n_seqs(); ++s) {
    end = std::max<int64_t>(end, int64_t{batch.slot_start[s]} + batch.kv_len[s]);
  }
  if (end > static_cast<int64_t>(table_.size())) {
    table_.resize(static_cast<size_t>(std::min(
        table_capacity_, std::max<int64_t>(end, 2 * static_cast<int64_t>(table_.size())))));
  }
  for (int32_t s = 0; s < batch.n_seqs(); ++s) {
    const int32_t n_w = batch.new_slot_start[s + 1] - batch.new_slot_start[s];
    std::copy_n(batch.new_slots.begin() + batch.new_slot_start[s], n_w,
                table_.begin() + batch.slot_start[s] + batch.kv_len[s] - n_w);
  }
}

Status CpuModelRunner::step(const StepBatchView& batch, StepOutput* out) {
  LITELLAMA_RETURN_IF_ERROR(batch.validate(n_slots_, config_.vocab_size, table_capacity_));
  if (!batch.embed_token_index.empty() && !supports_input_embeddings(batch.embed_rows_memory)) {
    return make_error(StatusCode::kUnsupported,
                      "the CPU backend reads input embeddings from host memory only");
  }
  write_slot_table(batch);
  const ModelConfig& c = config_;
  const int64_t T = batch.n_tokens(), H = c.hidden_size, hd = c.head_dim;
  const int64_t q_dim = int64_t{c.n_heads} * hd, kv_dim = int64_t{c.n_kv_heads} * hd;
  const int64_t inter = c.intermediate_size;
  const int32_t n_seqs = batch.n_seqs();

  // Per-token cos/sin: [T, hd/2]. Dynamic NTK depends on the sequence's length.
  const float attn_scaling = rope_attention_scaling(c);
  std::vector<float> cos_t(static_cast<size_t>(T * hd / 2)), sin_t(cos_t.size());
  {
    std::vector<float> inv = rope_inv_freq(c, 0);
    for (int32_t s = 0; s < n_seqs; ++s) {
      if (c.rope.type == RopeScalingType::kDynamic) inv = rope_inv_freq(c, batch.kv_len[s]);
      for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) {
        const auto p = static_cast<float>(batch.positions[t]);
        for (int64_t i = 0; i < hd / 2; ++i) {
          const float angle = p * inv[static_cast<size_t>(i)];
          cos_t[t * hd / 2 + i] = std::cos(angle) * attn_scaling;
          sin_t[t * hd / 2 + i] = std::sin(angle) * attn_scaling;
        }
      }
    }
  }
  auto apply_rope = [&](float* x, int64_t n_heads_x) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < n_heads_x; ++h) {
        float* v = x + (t * n_heads_x + h) * hd;
        for (int64_t i = 0; i < hd / 2; ++i) {
          const float a = v[i], b = v[i + hd / 2];
          const float cs = cos_t[t * hd / 2 + i], sn = sin_t[t * hd / 2 + i];
          v[i] = a * cs - b * sn;
          v[i + hd / 2] = b * cs + a * sn;
        }
      }
    }
  };

  std::vector<float> x(static_cast<size_t>(T * H)), h(x.size());
  std::vector<float> q(static_cast<size_t>(T * q_dim)), k(static_cast<size_t>(T * kv_dim)),
      v(k.size()), attn(q.size()), o(x.size());
  std::vector<float> gate(static_cast<size_t>(T * inter)), up(gate.size());
  for (int64_t t = 0, j = 0; t < T; ++t) {
    // A token named in embed_token_index takes its given row (row j, or embed_row_index[j]
    // when the batch names rows) instead of its id's embedding.
    const bool given = j < static_cast<int64_t>(batch.embed_token_index.size()) &&
                       batch.embed_token_index[static_cast<size_t>(j)] == t;
    int64_t given_row = 0;
    if (given) {
      given_row = batch.embed_row_index.empty() ? j : batch.embed_row_index[static_cast<size_t>(j)];
      ++j;
    }
    const float* row = given ? batch.embed_rows + given_row * H
                             : embed_.data() + static_cast<int64_t>(batch.token_ids[t]) * H;
    std::copy_n(row, H, x.data() + t * H);
  }
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const CpuLayer& L = layers_[static_cast<size_t>(l)];
    rms_norm(h.data(), x.data(), L.input_norm.data(), T, H);
    if (observer_) observer_(l, ProjectionInput::kQkv, h.data(), T, H);
    linear(q.data(), h.data(), L.wq.data(), c.qkv_bias ? L.bq.data() : nullptr, T, q_dim, H);
    linear(k.data(), h.data(), L.wk.data(), c.qkv_bias ? L.bk.data() : nullptr, T, kv_dim, H);
    linear(v.data(), h.data(), L.wv.data(), c.qkv_bias ? L.bv.data() : nullptr, T, kv_dim, H);
    if (c.qk_norm) {
      rms_norm(q.data(), q.data(), L.q_norm.data(), T * c.n_heads, hd);
      rms_norm(k.data(), k.data(), L.k_norm.data(), T * c.n_kv_heads, hd);
    }
    apply_rope(q.data(), c.n_heads);
    apply_rope(k.data(), c.n_kv_heads);
    // New tokens' K/V go to the last n_new slots of their sequence's table.
    float* kp = k_pool_[static_cast<size_t>(l)].data();
    float* vp = v_pool_[static_cast<size_t>(l)].data();
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) {
        const int32_t slot = table_[static_cast<size_t>(batch.slot_start[s] + batch.positions[t])];
        std::copy_n(k.data() + t * kv_dim, kv_dim, kp + int64_t{slot} * kv_dim);
        std::copy_n(v.data() + t * kv_dim, kv_dim, vp + int64_t{slot} * kv_dim);
      }
    }
    attention(attn.data(), q.data(), l, batch);
    if (observer_) observer_(l, ProjectionInput::kO, attn.data(), T, q_dim);
    linear(o.data(), attn.data(), L.wo.data(), nullptr, T, H, q_dim);
    for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];
    rms_norm(h.data(), x.data(), L.post_norm.data(), T, H);
    if (observer_) observer_(l, ProjectionInput::kGateUp, h.data(), T, H);
    linear(gate.data(), h.data(), L.w_gate.data(), nullptr, T, inter, H);
    linear(up.data(), h.data(), L.w_up.data(), nullptr, T, inter, H);
    for (int64_t i = 0; i < T * inter; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    if (observer_) observer_(l, ProjectionInput::kDown, gate.data(), T, inter);
    linear(o.data(), gate.data(), L.w_down.data(), nullptr, T, H, inter);
    for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];
  }

  // Logits only for the last token of each sampled sequence.
  out->sampled_ids.assign(static_cast<size_t>(n_seqs), -1);
  out->top_logits.assign(static_cast<size_t>(n_seqs), {});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out->logprobs.assign(batch.logprobs ? static_cast<size_t>(n_seqs) : 0, nan);
  out->lse.assign(out->logprobs.size(), nan);
  std::vector<int32_t> rows;
  for (int32_t s = 0; s < n_seqs; ++s) {
    if (batch.sample[s]) rows.push_back(s);
  }
  if (rows.empty()) return Status::ok();
  const auto R = static_cast<int64_t>(rows.size());
  std::vector<float> last(static_cast<size_t>(R * H)), normed(last.size());
  for (int64_t r = 0; r < R; ++r) {
    const int32_t t = batch.token_start[rows[r] + 1] - 1;
    std::copy_n(x.data() + int64_t{t} * H, H, last.data() + r * H);
  }
  rms_norm(normed.data(), last.data(), final_norm_.data(), R, H);
  std::vector<float> logits(static_cast<size_t>(R * c.vocab_size));
  const float* head = c.tie_word_embeddings ? embed_.data() : lm_head_.data();
  linear(logits.data(), normed.data(), head, nullptr, R, c.vocab_size, H);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t s = rows[r];
    std::span<float> row(logits.data() + r * c.vocab_size, static_cast<size_t>(c.vocab_size));
    if (batch.n_top_logits > 0) out->top_logits[s] = top_logits(row, batch.n_top_logits);
    SamplingInput input;
    input.n_generated = batch.n_generated[s];
    if (!batch.history_start.empty()) {
      const int32_t* hist = batch.history_ids.data() + batch.history_start[s];
      const int32_t n_hist = batch.history_start[s + 1] - batch.history_start[s];
      input.prompt_ids = {hist, static_cast<size_t>(batch.n_prompt[s])};
      input.generated_ids = {hist + batch.n_prompt[s],
                             static_cast<size_t>(n_hist - batch.n_prompt[s])};
    }
    if (!batch.logprobs) {
      out->sampled_ids[s] = sample_token(row, batch.sampling[s], input);
      continue;
    }
    // Logprobs of the raw logits: the sampler rewrites the row with its penalties.
    const std::vector<float> raw(row.begin(), row.end());
    const float lse = log_sum_exp(raw);
    const int32_t id = sample_token(row, batch.sampling[s], input);
    out->sampled_ids[s] = id;
    out->lse[s] = lse;
    out->logprobs[s] = raw[static_cast<size_t>(id)] - lse;
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> create_cpu_model_runner(const Checkpoint& checkpoint,
                                                             const RunnerOptions& options) {
  return create_observed_cpu_model_runner(checkpoint, options, nullptr);
}

Result<std::unique_ptr<ModelRunner>> create_observed_cpu_model_runner(const Checkpoint& checkpoint,
                                                                      const RunnerOptions& options,
                                                                      ActivationObserver observer) {
  if (options.compute_dtype != DType::kF32) {
    return make_error(StatusCode::kUnsupported,
                      "the CPU backend computes in float32 (got --dtype {}); use --dtype float32 "
                      "or --device cuda",
                      dtype_torch_name(options.compute_dtype));
  }
  const ModelConfig& c = checkpoint.config();
  int32_t n_slots = options.n_kv_slots;
  if (n_slots <= 0) {
    // A few full-length sequences (at least one step's tokens), within the memory budget.
    const int64_t per_slot = int64_t{2} * c.n_layers * c.n_kv_heads * c.head_dim * 4;
    const int64_t context = options.max_model_len > 0 ? std::min<int64_t>(options.max_model_len,
                                                                          c.max_position_embeddings)
                                                      : c.max_position_embeddings;
    const int64_t wanted =
        std::max<int64_t>(kDefaultKvContexts * context, options.max_batch_tokens);
    n_slots = static_cast<int32_t>(
        std::min<int64_t>({options.kv_memory_bytes / per_slot, wanted, int64_t{1} << 24}));
  }
  if (n_slots <= 0) {
    return make_error(StatusCode::kResourceExhausted, "KV pool would hold no token");
  }
  int32_t threads = options.n_threads > 0
                        ? options.n_threads
                        : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t table = options.slot_table_capacity > 0
                            ? options.slot_table_capacity
                            : default_slot_table_capacity(n_slots, options.max_batch_seqs);
  auto runner = std::make_unique<CpuModelRunner>(c, n_slots, threads, table);
  runner->set_observer(std::move(observer));
  LITELLAMA_RETURN_IF_ERROR(runner->load(checkpoint));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace litellama
