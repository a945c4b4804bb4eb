// CudaModelRunner: one step, top-down.
//
//   stage the step's arrays in pinned memory -> one cudaMemcpyAsync to the device (and one from
//       the worker's page-locked step ring for the step's new slot-table entries)
//   write_slot_table(the new entries into the device-resident slot table)
//   embedding -> residual
//   per layer, steps of more than gemv_max_tokens tokens (cuBLAS):
//     add_rmsnorm(residual += delta of the previous layer; normed)      (first layer: no add)
//     linear(qkv = normed @ [Wq; Wk; Wv]^T) -> qkv_rope (bias, q/k norm, RoPE, K/V into the pool)
//     attention_decode (sequences with one new token) + attention_prefill (the others)
//     linear(delta = attn @ Wo^T) -> add_rmsnorm(residual += delta; normed)
//     linear(gate_up = normed @ [Wgate; Wup]^T) -> silu_mul -> linear(delta = act @ Wdown^T)
//   per layer, smaller steps (bf16/fp16, up to RunnerOptions::gemv_max_tokens tokens): the
//   small-batch GEMV variants (kernels/gemv.h), whose epilogues do the element-wise work:
//     gemv_qkv_rope(RMSNorm as a scale of the sums of residual @ Wqkv'^T, where Wqkv' has the
//         input norm's weight folded in at load; bias, RoPE, Q and the pool)
//         (bf16 only, see fold_input_norms(); fp16: add_rmsnorm(normed) -> gemv_qkv_rope;
//         q/k-norm models: add_rmsnorm(normed) -> gemv(qkv) -> qkv_rope)
//     attention_decode (or its shared-prefix cascade, step_staging.h) / attention_prefill
//     gemv_residual_add(residual += attn @ Wo^T)
//     add_rmsnorm(normed = RMSNorm(residual)) -> linear(gate_up) -> silu_mul
//         (steps up to RunnerOptions::gemv_gate_up_max_tokens tokens, by default 8 for small
//         models and 4 for larger ones: gemv_silu_mul(act = SiLU(gate) * up) instead)
//     gemv_residual_add(residual += act @ Wdown^T)
//   gather the sampled sequences' last rows (skipped when those are all the rows, in order: pure
//   decode) -> add_rmsnorm(final norm; the cuBLAS path adds the last delta here)
//   cuBLAS(float32 logits = normed @ Wlm^T) at every batch size -> sampling
//   (float32 steps, batch_invariant(): the tiled GEMM for every linear layer and the LM head, and
//   general attention for decode and prefill)
//   (4-bit AWQ / GPTQ checkpoints: the unfused path at every batch size, each projection through
//   launch_w4_linear: its small-batch W4 GEMV up to kW4GemvMaxRows tokens, else dequantized into
//   a workspace and multiplied by cuBLAS or the tiled kernel, kernels/linear_w4.h; FP8 ones
//   likewise through launch_fp8_linear: its GEMV up to kFp8GemvMaxRows tokens, else per-token
//   activation quantization and the cuBLASLt FP8 GEMM, or the dequantizing path in float32,
//   kernels/linear_fp8.h)
//   one cudaMemcpyAsync of sampled ids (and top logits) back, then the step's only host sync.
//
// Every kernel but the GEMMs (cuBLAS, the tiled kernel) and prefill attention is launched with
// programmatic dependent launch (kernels/launch.h): it starts while its predecessor drains
// (except the gate/up GEMV, which the norm before it releases only after its own wait), GEMVs
// load their first weights before waiting for their input, and decode attention of up to 8
// sequences its first K/V tiles (all but the newest key). That last one relies on no sequence
// reading, as an earlier key, a slot that the same step writes (each new token gets a slot that
// no cached key occupies).
//
// Which of these paths a step takes, its attention split count, sampler and graph key are decided
// once per step by plan_forward() (forward_plan.h) before any launch; the code below follows that
// plan. A pure decode step (every sequence brings one token and is sampled) is launched through
// GraphRunner (graph_runner.h) under the plan's key, which holds (batch size, top-logit count,
// attention split count, whether every row is greedy, whether logprobs are returned). For a replay
// to be right, every array the kernels read lives at an offset of the staging buffer that depends
// only on the batch size (StepLayout puts the variable-length new slots last; the penalty history,
// the other variable-length array, has a staging buffer of its own), and the kernels read kv_len,
// the slot table and the history from device buffers rather than from launch arguments. The slot
// table stays on the device from step to step (its write runs before the graph, not in it), so a
// decode step copies one new slot per sequence instead of every sequence's table. Growing a
// staging buffer moves it, which drops every graph.
//
// Every buffer is allocated once in create(); a step allocates nothing unless its new slots or
// penalty history outgrow their staging buffers (they then grow geometrically, once).
#include "services/worker/cuda/cuda_model_runner.h"
#include "kernels/gpu_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "kernels/add_rmsnorm.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_general.h"
#include "kernels/attention_prefill.h"
#include "kernels/cuda_check.h"
#include "kernels/device_time.h"
#include "kernels/embedding.h"
#include "kernels/gather_rows.h"
#include "kernels/gemv.h"
#include "kernels/launch.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/qkv_rope.h"
#include "kernels/sampling.h"
#include "kernels/silu_mul.h"
#include "services/vision/embedding_pool.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cuda/cuda_context.h"
#include "services/worker/cuda/cuda_weights.h"
#include "services/worker/cuda/device_buffer.h"
#include "services/worker/cuda/forward_plan.h"
#include "services/worker/cuda/graph_runner.h"
#include "services/worker/cuda/kv_budget.h"
#include "services/worker/cuda/step_staging.h"
#include "services/worker/rope_scaling.h"

namespace litellama {

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// Upper bound of any sequence's kv_len, for the decode-attention workspace (whose split count is
// capped, so this only needs to be large).
constexpr int32_t kMaxKvLenHint = int32_t{1} << 30;
// Captured decode graphs kept at once; the least recently used is dropped beyond this.
constexpr size_t kMaxDecodeGraphs = 64;

class CudaModelRunner final : public ModelRunner {
 public:
  CudaModelRunner(ModelConfig config, RunnerOptions options)
      : config_(std::move(config)), options_(options), dtype_(options.compute_dtype) {
    options_.gemv_max_tokens = resolved_gemv_max_tokens(options_, config_.hidden_size);
    options_.gemv_gate_up_max_tokens =
        resolved_gemv_gate_up_max_tokens(options_, config_.hidden_size);
    if (config_.quant.method != QuantMethod::kNone) {
      // The fused GEMV variants read dense weights; 4-bit projections take launch_w4_linear,
      // whose small-batch kernel serves the same batches, in the unfused layer path.
      options_.gemv_max_tokens = 0;
      options_.gemv_gate_up_max_tokens = 0;
    }
  }

  Status init(const Checkpoint& checkpoint);

  const ModelConfig& config() const override { return config_; }
  int32_t n_kv_slots() const override { return n_slots_; }
  int64_t weight_bytes() const override {
    return static_cast<int64_t>(weights_.storage.size_bytes());
  }
  int64_t slot_table_capacity() const override { return table_capacity_; }
  Status step(const StepBatchView& batch, StepOutput* out) override;
  Status register_host_memory(void* data, size_t bytes) override;
  void unregister_host_memory(void* data) override;
  std::optional<double> last_step_device_seconds() const override {
    return last_step_device_seconds_;
  }
  std::optional<double> last_image_handoff_seconds() const override {
    return last_image_handoff_seconds_;
  }
  int64_t graph_replays() const override { return graphs_.replays(); }
  int64_t cascade_steps() const override { return cascade_steps_; }
  int64_t graph_captures() const override { return graphs_.captures(); }
  std::string explain_step(const StepBatchView& batch) const override;
  bool supports_input_embeddings(EmbeddingMemory memory) const override {
    return memory == EmbeddingMemory::kDevice;
  }
  Result<const float*> map_device_embeddings(const EmbeddingPoolDevice& pool,
                                             uint64_t bytes) override;
  void unmap_device_embeddings(const float* rows) override;

 private:
  Status allocate_workspaces();
  Status allocate_kv_pool();
  // Grows a pinned/device staging pair to at least `bytes` (geometrically), dropping the graphs.
  Status grow_staging(size_t bytes, PinnedBuffer* host, DeviceBuffer* device);
  Status ensure_staging(size_t bytes);
  Status ensure_history_staging(size_t bytes);
  // The facts plan_forward() reads besides the step itself.
  ForwardPlanContext forward_context() const;
  Status run_layers(const StepPlan& plan, const ForwardPlan& fp);
  // The step stream, with PDL for the kernels launched on it as RunnerOptions asks.
  KernelStream kernel_stream() const {
    return KernelStream(ctx_.stream(), options_.use_programmatic_launch);
  }
  // One layer through the fused GEMV variants (ForwardPlan::gemv_layers).
  Status run_layer_fused(const StepPlan& plan, const ForwardPlan& fp, int32_t l);
  Status run_attention(const StepPlan& plan, int32_t l);
  // qkv_rope for layer l over wide_ (the QKV projection's output).
  Status run_qkv_rope(const StepPlan& plan, int32_t l);
  // The step's RoPE frequency table and per-token table rows (null: row 0 for all; dynamic RoPE
  // gives sequences past the original context rows of their own).
  const float* rope_table(const StepPlan& plan) const;
  const int32_t* rope_table_rows(const StepPlan& plan) const;
  // y = x @ w^T for n_rows rows, in the compute dtype: a 4-bit projection (w4.n > 0) through
  // launch_w4_linear; else the small-batch GEMV when `gemv` (the plan's choice), else linear().
  // x_fp8: an FP8 projection's input is already in fp8_activations_ (the kernel before it wrote
  // it quantized, as the plan's fp8_fused_inputs say).
  Status project(bool gemv, void* y, const void* x, const void* w, const W4Weight& w4,
                 const Fp8Weight& fp8, int32_t n_rows, int32_t n, int32_t k, bool x_fp8 = false);
  // y = x @ w^T through cuBLAS, or the tiled kernel where the step must not depend on its batch
  // (batch_invariant()).
  Status linear(void* y, const void* x, const void* w, int32_t n_rows, int32_t n, int32_t k,
                DType out_dtype);
  // float32 with RunnerOptions::float32_batch_invariant: every GEMM runs the tiled kernel (each
  // output element summed in one order whatever the batch, kernels/linear.h) and attention the
  // general kernel (each query summed over its keys in one order whatever else the step holds,
  // kernels/attention_general.h), so that a request's ids and logits do not depend on what it is
  // batched with, on a prefix served from the cache, or on a preemption.
  bool batch_invariant() const { return dtype_ == DType::kF32 && options_.float32_batch_invariant; }
  CascadeOptions cascade_;  // shared-prefix decode planning (members 0: off or none for the dtype)
  std::optional<CascadeMemo> cascade_memo_;  // over table_host_, once it exists
  int64_t cascade_steps_ = 0;
  // Whether the layers' input norm weights are folded into W.qkv at load, so that the QKV GEMV
  // takes the norm in (kernels/gemv.h, GemvRmsNorm): models whose small steps use the QKV RoPE
  // GEMV, in bfloat16. In fp16, products of small weights and norm weights could fall into the
  // subnormal range.
  bool fold_input_norms() const;

  Status run_head(const StepPlan& plan, const ForwardPlan& fp);
  Status run_sampling(const StepPlan& plan, const ForwardPlan& fp);
  // The step's kernels after the staging copy: layers then head.
  Status run_kernels(const StepPlan& plan, const ForwardPlan& fp);
  // Runs the layers and the head, eagerly or through the graph runner, as the plan says.
  Status run_forward(const StepPlan& plan, const ForwardPlan& fp);
  void* k_pool(int32_t layer) const;
  void* v_pool(int32_t layer) const;

  ModelConfig config_;
  RunnerOptions options_;
  DType dtype_;
  size_t elem_bytes_ = 0;
  int32_t n_sms_ = 0;
  int32_t n_slots_ = 0;
  int32_t qkv_dim_ = 0;  // (n_heads + 2 n_kv_heads) * head_dim
  int32_t q_dim_ = 0;    // n_heads * head_dim
  float attention_scale_ = 1.0f;
  float rope_attention_scaling_ = 1.0f;

  CudaContext ctx_;
  CudaWeights weights_;
  DeviceBuffer kv_;           // [n_layers][K, V][n_slots, n_kv_heads, head_dim]
  size_t kv_pool_bytes_ = 0;  // one layer's K (or V)
  // Free device memory before the weights were uploaded: what this worker takes since then is
  // its own share of --gpu-memory-utilization.
  size_t free_before_load_ = 0;

  // Activations, [max_batch_tokens, ...] each.
  DeviceBuffer residual_;  // [T, hidden]
  DeviceBuffer normed_;    // [T, hidden]
  DeviceBuffer delta_;     // [T, hidden] output of o_proj / down_proj
  DeviceBuffer wide_;      // [T, max(qkv_dim, 2 * inter)]: qkv, then gate_up
  DeviceBuffer q_;         // [T, n_heads, head_dim]
  DeviceBuffer attn_;      // [T, n_heads, head_dim]
  DeviceBuffer act_;       // [T, inter]
  // Head, [max_batch_seqs, ...] each.
  DeviceBuffer last_residual_;  // [S, hidden]
  DeviceBuffer last_delta_;     // [S, hidden]
  DeviceBuffer last_normed_;    // [S, hidden]
  DeviceBuffer logits_;         // [S, vocab] float32
  DeviceBuffer token_marks_;    // [S, vocab] int32, zero at rest (sampling workspace)
  DeviceBuffer results_;        // sampled ids, top ids, top logits of one step, packed
  PinnedBuffer results_host_;
  DeviceBuffer rope_inv_freq_;  // [head_dim / 2] the table of every non-dynamic variant
  DeviceBuffer attention_workspace_;
  DeviceBuffer cublas_workspace_;
  // [max quantized projection n * k] of the compute dtype where a dequantizing path may run, or
  // none.
  DeviceBuffer dequant_workspace_;
  // FP8 checkpoints: activations quantized per token ([T, max k] e4m3 and [T] scales) and the
  // cuBLASLt state where the device has FP8 tensor cores (null otherwise).
  DeviceBuffer fp8_activations_;
  DeviceBuffer fp8_scales_;
  std::unique_ptr<Fp8Gemm> fp8_gemm_;
  // Step metadata: the same layout on both sides (StepLayout).
  PinnedBuffer staging_host_;
  DeviceBuffer staging_device_;
  // The slot table (StepBatchView's contract) on the device, and its host copy, which the host
  // reads each new token's slot from.
  int64_t table_capacity_ = 0;
  DeviceBuffer table_device_;
  std::vector<int32_t> table_host_;
  // The penalty history of a step (StepBatch::history_ids), int32.
  PinnedBuffer history_host_;
  DeviceBuffer history_device_;
  GraphRunner graphs_{kMaxDecodeGraphs};  // decode graphs by ForwardPlan::graph_key
  std::optional<double> last_step_device_seconds_;
  // Device embedding pools mapped through map_device_embeddings: the rows, the exporter's ready
  // event (null: it exports none) and its "rows complete" stamp (null: none, or another GPU's
  // clock).
  struct MappedPool {
    const float* rows = nullptr;
    cudaEvent_t ready = nullptr;
    const uint64_t* finished_ns = nullptr;
  };
  std::vector<MappedPool> mapped_pools_;
  // Waits for a pool's ready event before a step reads its rows (bounded: an exporter that died
  // mid-encode fails the step instead of stalling the worker).
  Status wait_for_rows(const MappedPool& pool) const;
  // The mapped pool whose rows this step reads (null: none), the int64 nanoseconds the step's
  // hand-off kernel writes (page-locked), and the last figure.
  const MappedPool* step_rows_pool_ = nullptr;
  PinnedBuffer handoff_ns_;
  std::optional<double> last_image_handoff_seconds_;
};

void* CudaModelRunner::k_pool(int32_t layer) const {
  return kv_.as<char>(static_cast<size_t>(2 * layer) * kv_pool_bytes_);
}
void* CudaModelRunner::v_pool(int32_t layer) const {
  return kv_.as<char>(static_cast<size_t>(2 * layer + 1) * kv_pool_bytes_);
}

Status CudaModelRunner::init(const Checkpoint& checkpoint) {
  const ModelConfig& c = config_;
#if LITELLAMA_HIP
  if (c.quant.method == QuantMethod::kFp8) {
    // gfx90a has no FP8 arithmetic and HIP 5.2 no FP8 types: refused before anything else, whatever
    // a later build of the quantized kernels adds on CUDA.
    return make_error(StatusCode::kUnsupported,
                      "'{}' is an FP8 checkpoint; the HIP build does not run FP8 (no FP8 types in "
                      "HIP 5.2, no FP8 arithmetic on gfx90a): use --device cpu or a bf16/fp16 "
                      "checkpoint",
                      checkpoint.dir());
  }
#endif
  const bool int4 = c.quant.method == QuantMethod::kAwq ||
                    (c.quant.method == QuantMethod::kGptq && c.quant.bits == 4);
  if (c.quant.method != QuantMethod::kNone && !int4 && c.quant.method != QuantMethod::kFp8) {
    // int8 and 8-bit GPTQ kernels are not built yet; the CPU backend dequantizes them.
    return make_error(StatusCode::kUnsupported,
                      "'{}' is a {} {}-bit checkpoint (quantization_config); the CUDA backend runs "
                      "unquantized, FP8 and 4-bit AWQ / GPTQ ones: use --device cpu",
                      checkpoint.dir(), quant_method_name(c.quant.method), c.quant.bits);
  }
  elem_bytes_ = dtype_size_bytes(dtype_);
  qkv_dim_ = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
  q_dim_ = c.n_heads * c.head_dim;
  attention_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  rope_attention_scaling_ = rope_attention_scaling(c);
  int device = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&n_sms_, cudaDevAttrMultiProcessorCount, device));
  LITELLAMA_RETURN_IF_ERROR(ctx_.init());
  size_t total_bytes = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_before_load_, &total_bytes));
  LITELLAMA_ASSIGN_OR_RETURN(weights_, CudaWeights::upload(checkpoint, dtype_, fold_input_norms()));
  LITELLAMA_RETURN_IF_ERROR(allocate_workspaces());
  LITELLAMA_RETURN_IF_ERROR(allocate_kv_pool());
  // Uploads and memsets ran on the legacy stream, which the non-blocking step stream does not
  // wait for.
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

Status CudaModelRunner::allocate_workspaces() {
  const ModelConfig& c = config_;
  const auto T = static_cast<size_t>(options_.max_batch_tokens);
  const auto S = static_cast<size_t>(options_.max_batch_seqs);
  const auto H = static_cast<size_t>(c.hidden_size);
  const auto inter = static_cast<size_t>(c.intermediate_size);
  const auto V = static_cast<size_t>(c.vocab_size);
  const size_t e = elem_bytes_;
  LITELLAMA_ASSIGN_OR_RETURN(residual_, DeviceBuffer::allocate(T * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(normed_, DeviceBuffer::allocate(T * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(delta_, DeviceBuffer::allocate(T * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(
      wide_, DeviceBuffer::allocate(T * std::max(static_cast<size_t>(qkv_dim_), 2 * inter) * e));
  LITELLAMA_ASSIGN_OR_RETURN(q_, DeviceBuffer::allocate(T * q_dim_ * e));
  LITELLAMA_ASSIGN_OR_RETURN(attn_, DeviceBuffer::allocate(T * q_dim_ * e));
  LITELLAMA_ASSIGN_OR_RETURN(act_, DeviceBuffer::allocate(T * inter * e));
  LITELLAMA_ASSIGN_OR_RETURN(last_residual_, DeviceBuffer::allocate(S * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(last_delta_, DeviceBuffer::allocate(S * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(last_normed_, DeviceBuffer::allocate(S * H * e));
  LITELLAMA_ASSIGN_OR_RETURN(logits_, DeviceBuffer::allocate(S * V * sizeof(float)));
  const size_t marks_bytes = sampling_workspace_size_bytes(options_.max_batch_seqs, c.vocab_size);
  LITELLAMA_ASSIGN_OR_RETURN(token_marks_, DeviceBuffer::allocate(marks_bytes));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemset(token_marks_.data(), 0, marks_bytes));
  // Sampled ids, top ids and logits, logprobs and log-sum-exps (see step()).
  const size_t results_bytes = S * sizeof(int32_t) +
                               2 * S * kSamplingMaxTopLogits * sizeof(int32_t) +
                               2 * S * sizeof(float) + 64;
  LITELLAMA_ASSIGN_OR_RETURN(results_, DeviceBuffer::allocate(results_bytes));
  LITELLAMA_ASSIGN_OR_RETURN(results_host_, PinnedBuffer::allocate(results_bytes));
  LITELLAMA_ASSIGN_OR_RETURN(handoff_ns_, PinnedBuffer::allocate(sizeof(int64_t)));

  const std::vector<float> inv_freq = rope_inv_freq(c, 0);
  LITELLAMA_ASSIGN_OR_RETURN(rope_inv_freq_,
                             DeviceBuffer::allocate(inv_freq.size() * sizeof(float)));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(rope_inv_freq_.data(), inv_freq.data(),
                                            inv_freq.size() * sizeof(float),
                                            cudaMemcpyHostToDevice));

  // Shared-prefix decode (fill_step plans it, run_attention launches it) where the kernel exists.
  cascade_.members = options_.decode_cascade ? attention_decode_cascade_members(
                                                   dtype_, c.head_dim, c.n_heads, c.n_kv_heads)
                                             : 0;
  cascade_.n_sms = n_sms_;
  const size_t attn_ws = std::max(
      attention_decode_workspace_size_bytes(options_.max_batch_seqs, c.n_heads, c.n_kv_heads,
                                            c.head_dim, kMaxKvLenHint, n_sms_),
      cascade_.members > 0
          ? attention_decode_cascade_workspace_bytes(
                options_.max_batch_seqs * (kCascadeMaxPrefixSplits + 1), c.n_heads, c.head_dim)
          : size_t{0});
  LITELLAMA_ASSIGN_OR_RETURN(attention_workspace_, DeviceBuffer::allocate(attn_ws));
  LITELLAMA_ASSIGN_OR_RETURN(cublas_workspace_, DeviceBuffer::allocate(kCublasWorkspaceBytes));
  if (weights_.max_fp8_elements > 0 && (dtype_ == DType::kBF16 || dtype_ == DType::kF16) &&
      fp8_gemm_available()) {
    LITELLAMA_ASSIGN_OR_RETURN(fp8_gemm_, Fp8Gemm::create());
    const size_t max_k = std::max({H, inter, static_cast<size_t>(q_dim_)});
    LITELLAMA_ASSIGN_OR_RETURN(fp8_activations_, DeviceBuffer::allocate(T * max_k));
    LITELLAMA_ASSIGN_OR_RETURN(fp8_scales_, DeviceBuffer::allocate(T * sizeof(float)));
  }
  // The dequantizing path's dense copy of one projection: 4-bit steps of more than
  // kW4GemvMaxRows tokens, float32, portable builds; FP8 where no FP8 GEMM runs.
  const int64_t dequant_elements =
      std::max(weights_.max_w4_elements, fp8_gemm_ ? int64_t{0} : weights_.max_fp8_elements);
  if (dequant_elements > 0) {
    LITELLAMA_ASSIGN_OR_RETURN(
        dequant_workspace_,
        DeviceBuffer::allocate(static_cast<size_t>(dequant_elements) * elem_bytes_));
  }
  LITELLAMA_RETURN_IF_ERROR(
      linear_handle_set_workspace(ctx_.linear(), cublas_workspace_.data(), kCublasWorkspaceBytes));

  // Staging for a full batch whose slot tables hold 4 max_batch_tokens positions, and for a
  // penalty history of as many ids (longer ones grow them on first use).
  const size_t per_token = 4 * sizeof(int32_t);
  const size_t per_seq = 8 * sizeof(int32_t) + sizeof(SamplingRow) +
                         static_cast<size_t>(c.head_dim / 2) * sizeof(float);
  LITELLAMA_RETURN_IF_ERROR(ensure_history_staging(T * 4 * sizeof(int32_t)));
  return ensure_staging(T * (per_token + 4 * sizeof(int32_t)) + (S + 1) * per_seq + 4096);
}

Status CudaModelRunner::allocate_kv_pool() {
  const ModelConfig& c = config_;
  const size_t slot_bytes = static_cast<size_t>(c.n_kv_heads) * c.head_dim * elem_bytes_;
  const size_t per_slot_all_layers = slot_bytes * 2 * static_cast<size_t>(c.n_layers);
  int64_t n_slots = options_.n_kv_slots;
  if (n_slots <= 0) {
    size_t free_bytes = 0, total_bytes = 0;
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    KvBudgetInputs in;
    in.free_before_load = free_before_load_;
    in.free_now = free_bytes;
    in.total = total_bytes;
    in.kv_memory_fraction = options_.kv_memory_fraction;
    in.gpu_memory_utilization = options_.gpu_memory_utilization;
    in.reserve_bytes = options_.reserve_device_bytes;
    LITELLAMA_ASSIGN_OR_RETURN(const double budget, kv_pool_budget_bytes(in));
    n_slots = static_cast<int64_t>(budget / static_cast<double>(per_slot_all_layers));
    n_slots = std::min<int64_t>(n_slots, int64_t{1} << 30);
  }
  if (n_slots <= 0) {
    return make_error(StatusCode::kResourceExhausted,
                      "the KV pool would hold no token: {} bytes per slot, fraction {} of free "
                      "device memory",
                      per_slot_all_layers, options_.kv_memory_fraction);
  }
  n_slots_ = static_cast<int32_t>(n_slots);
  kv_pool_bytes_ = align_up(static_cast<size_t>(n_slots_) * slot_bytes, 256);
  LITELLAMA_ASSIGN_OR_RETURN(
      kv_, DeviceBuffer::allocate(kv_pool_bytes_ * 2 * static_cast<size_t>(c.n_layers)));
  table_capacity_ = options_.slot_table_capacity > 0
                        ? options_.slot_table_capacity
                        : default_slot_table_capacity(n_slots_, options_.max_batch_seqs);
  const size_t table_bytes = static_cast<size_t>(table_capacity_) * sizeof(int32_t);
  LITELLAMA_ASSIGN_OR_RETURN(table_device_, DeviceBuffer::allocate(table_bytes));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemset(table_device_.data(), 0, table_bytes));
  table_host_.assign(static_cast<size_t>(table_capacity_), 0);
  cascade_memo_.emplace(table_host_.size());
  return Status::ok();
}

Status CudaModelRunner::run_kernels(const StepPlan& plan, const ForwardPlan& fp) {
  LITELLAMA_RETURN_IF_ERROR(run_layers(plan, fp));
  return plan.sampled_seqs.empty() ? Status::ok() : run_head(plan, fp);
}

ForwardPlanContext CudaModelRunner::forward_context() const {
  ForwardPlanContext ctx;
  ctx.config = &config_;
  ctx.options = &options_;
  ctx.dtype = dtype_;
  ctx.n_sms = n_sms_;
  ctx.input_norms_folded = weights_.input_norms_folded;
  ctx.w4_group = weights_.w4_group;
  ctx.fp8 = weights_.max_fp8_elements > 0;
  ctx.fp8_gemm = fp8_gemm_ != nullptr;
  ctx.graphs_available = graphs_.available();
  return ctx;
}

std::string CudaModelRunner::explain_step(const StepBatchView& batch) const {
  return plan_forward(plan_step(batch, config_, cascade_.members > 0), batch.n_top_logits,
                      forward_context())
      .describe();
}

Status CudaModelRunner::grow_staging(size_t bytes, PinnedBuffer* host, DeviceBuffer* device) {
  if (host->size_bytes() >= bytes) return Status::ok();
  // Rare (a longer slot table or history than ever before): wait until no copy uses them.
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_.stream()));
  const size_t grown = std::max(bytes, host->size_bytes() * 2);
  graphs_.clear();  // they read the old buffer
  *host = PinnedBuffer();
  *device = DeviceBuffer();
  LITELLAMA_ASSIGN_OR_RETURN(*host, PinnedBuffer::allocate(grown));
  LITELLAMA_ASSIGN_OR_RETURN(*device, DeviceBuffer::allocate(grown));
  return Status::ok();
}

Status CudaModelRunner::ensure_staging(size_t bytes) {
  return grow_staging(bytes, &staging_host_, &staging_device_);
}

Status CudaModelRunner::ensure_history_staging(size_t bytes) {
  return grow_staging(bytes, &history_host_, &history_device_);
}

Status CudaModelRunner::register_host_memory(void* data, size_t bytes) {
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterDefault));
  return Status::ok();
}

void CudaModelRunner::unregister_host_memory(void* data) {
  (void)cudaStreamSynchronize(ctx_.stream());
  (void)cudaHostUnregister(data);
}

Result<const float*> CudaModelRunner::map_device_embeddings(const EmbeddingPoolDevice& pool,
                                                            uint64_t bytes) {
  int device = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  unsigned char uuid[16];
  LITELLAMA_CUDA_RETURN_IF_ERROR(gpu_device_uuid(device, uuid));
  const bool same_gpu = std::memcmp(uuid, pool.device_uuid.data(), sizeof uuid) == 0;
  cudaIpcMemHandle_t handle;
  static_assert(sizeof handle == std::tuple_size_v<decltype(pool.ipc_handle)>);
  std::memcpy(&handle, pool.ipc_handle.data(), sizeof handle);
  void* rows = nullptr;
  // Another GPU's pool is read over peer access where the two GPUs have it.
  const cudaError_t err = cudaIpcOpenMemHandle(&rows, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(StatusCode::kUnavailable,
                      "cannot map the embedding pool's device memory (CUDA IPC, {} GPU): {}",
                      same_gpu ? "this worker's" : "another", cudaGetErrorString(err));
  }
  (void)bytes;  // the allocation is the exporter's; its size is checked by whoever wrote the pool
  MappedPool mapped;
  mapped.rows = static_cast<const float*>(rows);
  const bool has_event = std::any_of(pool.ready_event.begin(), pool.ready_event.end(),
                                     [](uint8_t b) { return b != 0; });
  if (has_event) {
    cudaIpcEventHandle_t event_handle;
    static_assert(sizeof event_handle == std::tuple_size_v<decltype(pool.ready_event)>);
    std::memcpy(&event_handle, pool.ready_event.data(), sizeof event_handle);
    const cudaError_t opened = cudaIpcOpenEventHandle(&mapped.ready, event_handle);
    if (opened != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaIpcCloseMemHandle(rows);
      return make_error(StatusCode::kUnavailable,
                        "cannot open the embedding pool's ready event (CUDA IPC): {}",
                        cudaGetErrorString(opened));
    }
  }
  // The stamp is comparable with this GPU's clock only when the pool is on this GPU.
  if (same_gpu && pool.finished_ns_offset > 0 && device_time_supported()) {
    mapped.finished_ns =
        reinterpret_cast<const uint64_t*>(static_cast<const char*>(rows) + pool.finished_ns_offset);
  }
  mapped_pools_.push_back(mapped);
  return mapped.rows;
}

void CudaModelRunner::unmap_device_embeddings(const float* rows) {
  if (rows == nullptr) return;
  (void)cudaStreamSynchronize(ctx_.stream());
  for (auto it = mapped_pools_.begin(); it != mapped_pools_.end(); ++it) {
    if (it->rows != rows) continue;
    if (it->ready != nullptr) (void)cudaEventDestroy(it->ready);
    mapped_pools_.erase(it);
    break;
  }
  (void)cudaIpcCloseMemHandle(const_cast<float*>(rows));
}

Status CudaModelRunner::wait_for_rows(const MappedPool& pool) const {
  if (pool.ready == nullptr) return Status::ok();
  // An encode takes milliseconds; this bounds a wait on an exporter that will never record again.
  constexpr double kTimeoutSeconds = 30.0;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t state = cudaEventQuery(pool.ready);
    if (state == cudaSuccess) return Status::ok();
    if (state != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return make_error(StatusCode::kUnavailable,
                        "the embedding pool's ready event failed (its vision process is gone?): {}",
                        cudaGetErrorString(state));
    }
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > kTimeoutSeconds) {
      return make_error(StatusCode::kUnavailable,
                        "the image rows of this step were not complete after {} s (the vision "
                        "process stopped mid-encode?)",
                        kTimeoutSeconds);
    }
  }
}

Status CudaModelRunner::step(const StepBatchView& batch, StepOutput* out) {
  // The new slots are range-checked as fill_step copies them (one pass over them instead of two).
  LITELLAMA_RETURN_IF_ERROR(
      batch.validate(n_slots_, config_.vocab_size, table_capacity_, /*check_slots=*/false));
  if (!batch.embed_token_index.empty() && !supports_input_embeddings(batch.embed_rows_memory)) {
    return make_error(StatusCode::kUnsupported,
                      "the CUDA backend reads input embedding rows in device memory only");
  }
  if (batch.n_tokens() > options_.max_batch_tokens || batch.n_seqs() > options_.max_batch_seqs) {
    return make_error(StatusCode::kInvalidArgument,
                      "step of {} tokens in {} sequences exceeds max_batch_tokens {} or "
                      "max_batch_seqs {}",
                      batch.n_tokens(), batch.n_seqs(), options_.max_batch_tokens,
                      options_.max_batch_seqs);
  }
  if (!sampling_supports(config_.vocab_size, batch.n_top_logits)) {
    return make_error(StatusCode::kUnsupported,
                      "the CUDA backend returns at most {} top logits (asked for {})",
                      kSamplingMaxTopLogits, batch.n_top_logits);
  }
  step_rows_pool_ = nullptr;
  last_image_handoff_seconds_.reset();
  if (!batch.embed_token_index.empty()) {
    // Rows an exporter announced may still be in its stream: run_layers waits for its ready
    // event right before the first read of them, everything before already launched.
    for (const MappedPool& pool : mapped_pools_) {
      if (pool.rows == batch.embed_rows) step_rows_pool_ = &pool;
    }
  }
  StepPlan plan = plan_step(batch, config_, cascade_.members > 0);
  const StepLayout& L = plan.layout;
  LITELLAMA_RETURN_IF_ERROR(ensure_staging(L.total_bytes));
  const size_t history_bytes = batch.history_ids.size() * sizeof(int32_t);
  // The second half of the history's device buffer is the sampler's logprob scratch.
  if (history_bytes > 0) LITELLAMA_RETURN_IF_ERROR(ensure_history_staging(2 * history_bytes));
  // New slots in registered memory (the worker's step ring) are copied to the device from there.
  const bool slots_in_place = batch.registered && plan.n_new_slots > 0;
  LITELLAMA_RETURN_IF_ERROR(fill_step(batch, config_, &plan, n_slots_, !slots_in_place,
                                      table_host_.data(), staging_host_.data(), cascade_,
                                      &*cascade_memo_));
  if (history_bytes > 0) std::memcpy(history_host_.data(), batch.history_ids.data(), history_bytes);
  cudaStream_t stream = ctx_.stream();
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ctx_.step_start(), stream));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_device_.data(), staging_host_.data(),
                                                 slots_in_place ? L.new_slots : L.total_bytes,
                                                 cudaMemcpyHostToDevice, stream));
  if (slots_in_place) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging_device_.as<char>(L.new_slots), batch.new_slots.data(),
                        batch.new_slots.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  auto i32 = [&](size_t offset) { return staging_device_.as<const int32_t>(offset); };
  LITELLAMA_RETURN_IF_ERROR(launch_write_slot_table(table_device_.as<int32_t>(), i32(L.slot_start),
                                                    i32(L.kv_len), i32(L.new_slot_start),
                                                    i32(L.new_slots), plan.n_seqs, stream));
  if (history_bytes > 0) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(history_device_.data(), history_host_.data(),
                                                   history_bytes, cudaMemcpyHostToDevice, stream));
  }
  const ForwardPlan fp = plan_forward(plan, batch.n_top_logits, forward_context());
  LITELLAMA_RETURN_IF_ERROR(run_forward(plan, fp));
  if (fp.attention_cascade) ++cascade_steps_;

  const auto n_sampled = static_cast<int32_t>(plan.sampled_seqs.size());
  const int32_t n_top = batch.n_top_logits;
  out->sampled_ids.assign(static_cast<size_t>(plan.n_seqs), -1);
  out->top_logits.resize(static_cast<size_t>(plan.n_seqs));
  for (auto& top : out->top_logits) top.clear();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out->logprobs.assign(plan.logprobs ? static_cast<size_t>(plan.n_seqs) : 0, nan);
  out->lse.assign(out->logprobs.size(), nan);
  // results_: sampled [n_sampled] | top ids [n_sampled, n_top] | top logits [n_sampled, n_top],
  // then with logprobs: logprobs [n_sampled] | lse [n_sampled].
  const size_t results_bytes =
      static_cast<size_t>(n_sampled) * (1 + 2 * n_top + (plan.logprobs ? 2 : 0)) * sizeof(int32_t);
  if (n_sampled > 0) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host_.data(), results_.data(),
                                                   results_bytes, cudaMemcpyDeviceToHost, stream));
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(ctx_.step_end(), stream));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  float device_ms = 0.0f;
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&device_ms, ctx_.step_start(), ctx_.step_end()));
  last_step_device_seconds_ = 1e-3 * static_cast<double>(device_ms);
  if (step_rows_pool_ != nullptr && step_rows_pool_->finished_ns != nullptr && plan.n_embed > 0) {
    last_image_handoff_seconds_ = 1e-9 * static_cast<double>(*handoff_ns_.as<const int64_t>());
  }
  if (n_sampled == 0) return Status::ok();
  const auto* sampled = results_host_.as<const int32_t>();
  const int32_t* top_ids = sampled + n_sampled;
  const auto* top_values = reinterpret_cast<const float*>(top_ids + n_sampled * n_top);
  const float* logprobs = top_values + n_sampled * n_top;
  const float* lse = logprobs + n_sampled;
  for (int32_t r = 0; r < n_sampled; ++r) {
    const auto s = static_cast<size_t>(plan.sampled_seqs[static_cast<size_t>(r)]);
    out->sampled_ids[s] = sampled[r];
    if (plan.logprobs) {
      out->logprobs[s] = logprobs[r];
      out->lse[s] = lse[r];
    }
    auto& top = out->top_logits[s];
    top.reserve(static_cast<size_t>(n_top));
    for (int32_t i = 0; i < n_top; ++i) {
      top.emplace_back(top_ids[r * n_top + i], top_values[r * n_top + i]);
    }
  }
  return Status::ok();
}

Status CudaModelRunner::run_forward(const StepPlan& plan, const ForwardPlan& fp) {
  if (!fp.graph) return run_kernels(plan, fp);
  return graphs_.run(fp.graph_key, ctx_.stream(), [&] { return run_kernels(plan, fp); });
}

bool CudaModelRunner::fold_input_norms() const {
  const ModelConfig& c = config_;
  return dtype_ == DType::kBF16 && options_.gemv_max_tokens > 0 && !c.qk_norm &&
         gemv_rope_supports(c.head_dim);
}

Status CudaModelRunner::run_layer_fused(const StepPlan& plan, const ForwardPlan& fp, int32_t l) {
  const ModelConfig& c = config_;
  const StepLayout& L = plan.layout;
  const CudaLayerWeights& W = weights_.layers[static_cast<size_t>(l)];
  const KernelStream stream = kernel_stream();
  auto i32 = [&](size_t offset) { return staging_device_.as<const int32_t>(offset); };
  const int32_t T = plan.n_tokens;
  const int32_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
#if LITELLAMA_PROFILING
  const LayerKernelRepeats& repeats = options_.layer_kernel_repeats;
#else
  constexpr LayerKernelRepeats repeats{};
#endif
  // Launches `launch` `count` times (RunnerOptions::layer_kernel_repeats in a profiling build; once
  // in every other).
  auto repeat = [](int32_t count, const auto& launch) -> Status {
    for (int32_t i = 0; i < count; ++i) LITELLAMA_RETURN_IF_ERROR(launch());
    return Status::ok();
  };
  const bool rope_gemv = fp.qkv != QkvPath::kLinearThenRope;
  // The input norm inside the QKV GEMV (its weight folded into W.qkv at load).
  const bool qkv_norm_in_gemv = fp.qkv == QkvPath::kFoldedNormGemvRope;
  if (!qkv_norm_in_gemv) {
    LITELLAMA_RETURN_IF_ERROR(launch_add_rmsnorm(normed_.data(), residual_.data(), nullptr,
                                                 W.input_norm, T, H, eps, dtype_, stream));
  }
  LITELLAMA_RETURN_IF_ERROR(repeat(repeats.qkv, [&]() -> Status {
    if (rope_gemv) {
      const GemvRope rope{
          q_.data(),        k_pool(l),        v_pool(l),         W.qkv_bias,
          rope_table(plan), i32(L.positions), i32(L.token_slot), rope_table_rows(plan),
          c.n_heads,        c.n_kv_heads,     c.head_dim,        rope_attention_scaling_};
      return launch_gemv_qkv_rope(
          rope, qkv_norm_in_gemv ? residual_.data() : normed_.data(), W.qkv, T, H, dtype_, stream,
          qkv_norm_in_gemv ? std::optional(GemvRmsNorm{eps}) : std::nullopt);
    }
    LITELLAMA_RETURN_IF_ERROR(
        launch_gemv(wide_.data(), normed_.data(), W.qkv, T, qkv_dim_, H, dtype_, dtype_, stream));
    return run_qkv_rope(plan, l);
  }));
  LITELLAMA_RETURN_IF_ERROR(repeat(repeats.attention, [&] { return run_attention(plan, l); }));
  LITELLAMA_RETURN_IF_ERROR(repeat(repeats.o, [&] {
    return launch_gemv_residual_add(residual_.data(), attn_.data(), W.o, T, H, q_dim_, dtype_,
                                    stream);
  }));
  // Before the gate/up GEMV the norm lets it launch only once the o projection is done, so that
  // its blocks do not start on multiprocessors still configured for decode attention's shared
  // memory, where they run slowly; the norm kernel in between costs about nothing. cuBLAS does
  // not launch early either way.
  const bool gate_up_gemv = fp.gate_up_gemv;
  LITELLAMA_RETURN_IF_ERROR(repeat(repeats.post_norm, [&] {
    return launch_add_rmsnorm(normed_.data(), residual_.data(), nullptr, W.post_norm, T, H, eps,
                              dtype_, stream, /*dependents_after_input=*/gate_up_gemv);
  }));
  LITELLAMA_RETURN_IF_ERROR(repeat(repeats.gate_up, [&]() -> Status {
    if (gate_up_gemv) {
      return launch_gemv_silu_mul(act_.data(), normed_.data(), W.gate_up, T, c.intermediate_size, H,
                                  dtype_, stream);
    }
    LITELLAMA_RETURN_IF_ERROR(
        linear(wide_.data(), normed_.data(), W.gate_up, T, 2 * c.intermediate_size, H, dtype_));
    return launch_silu_mul(act_.data(), wide_.data(), T, c.intermediate_size, dtype_, stream);
  }));
  return repeat(repeats.down, [&] {
    return launch_gemv_residual_add(residual_.data(), act_.data(), W.down, T, H,
                                    c.intermediate_size, dtype_, stream);
  });
}

Status CudaModelRunner::project(bool gemv, void* y, const void* x, const void* w,
                                const W4Weight& w4, const Fp8Weight& fp8, int32_t n_rows, int32_t n,
                                int32_t k, bool x_fp8) {
  if (w4.n > 0) {
    return launch_w4_linear(y, x, w4, n_rows, dtype_, dequant_workspace_.data(), batch_invariant(),
                            ctx_.linear(), kernel_stream());
  }
  if (fp8.n > 0) {
    Fp8Scratch scratch;
    scratch.xq = fp8_activations_.as<uint8_t>();
    scratch.x_scales = fp8_scales_.as<float>();
    scratch.x_quantized = x_fp8;
    scratch.dense = dequant_workspace_.data();
    scratch.gemm = fp8_gemm_.get();
    scratch.gemm_workspace = cublas_workspace_.data();
    scratch.gemm_workspace_bytes = kCublasWorkspaceBytes;
    return launch_fp8_linear(y, x, fp8, n_rows, dtype_, scratch, batch_invariant(), ctx_.linear(),
                             kernel_stream());
  }
  if (gemv) return launch_gemv(y, x, w, n_rows, n, k, dtype_, dtype_, kernel_stream());
  return linear(y, x, w, n_rows, n, k, dtype_);
}

Status CudaModelRunner::linear(void* y, const void* x, const void* w, int32_t n_rows, int32_t n,
                               int32_t k, DType out_dtype) {
  if (batch_invariant()) {
    return launch_linear_tiled(y, x, w, n_rows, n, k, dtype_, out_dtype, kernel_stream());
  }
  return launch_linear(y, x, w, n_rows, n, k, dtype_, out_dtype, ctx_.linear(), kernel_stream());
}

Status CudaModelRunner::run_layers(const StepPlan& plan, const ForwardPlan& fp) {
  const ModelConfig& c = config_;
  const StepLayout& L = plan.layout;
  const KernelStream stream = kernel_stream();
  auto i32 = [&](size_t offset) { return staging_device_.as<const int32_t>(offset); };
  const int32_t T = plan.n_tokens;
  const int32_t H = c.hidden_size;
  const int32_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  LITELLAMA_RETURN_IF_ERROR(
      launch_embedding(residual_.data(), i32(L.token_ids), weights_.embed, T, H, dtype_, stream));
  if (step_rows_pool_ != nullptr && plan.n_embed > 0) {
    LITELLAMA_RETURN_IF_ERROR(wait_for_rows(*step_rows_pool_));
    if (step_rows_pool_->finished_ns != nullptr) {
      // The image hand-off as the GPU sees it: from the exporter's "rows complete" stamp to
      // here, the first read of the rows.
      LITELLAMA_RETURN_IF_ERROR(launch_device_time_since(step_rows_pool_->finished_ns,
                                                         handoff_ns_.as<int64_t>(), stream));
    }
  }
  LITELLAMA_RETURN_IF_ERROR(launch_scatter_rows_f32(
      residual_.data(), plan.embed_rows, i32(L.embed_index),
      plan.embed_by_row_index ? i32(L.embed_row_index) : nullptr, plan.n_embed, H, dtype_, stream));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    if (fp.gemv_layers) {
      LITELLAMA_RETURN_IF_ERROR(run_layer_fused(plan, fp, l));
      continue;
    }
    const CudaLayerWeights& W = weights_.layers[static_cast<size_t>(l)];
    // The norms and silu_mul write their output as e4m3 where the FP8 GEMM takes it.
    const bool* q = fp.fp8_fused_inputs;
    auto norm = [&](const void* delta, const float* weight, bool fp8) {
      return fp8 ? launch_add_rmsnorm_fp8(fp8_activations_.as<uint8_t>(), fp8_scales_.as<float>(),
                                          residual_.data(), delta, weight, T, H, eps, dtype_,
                                          stream)
                 : launch_add_rmsnorm(normed_.data(), residual_.data(), delta, weight, T, H, eps,
                                      dtype_, stream);
    };
    LITELLAMA_RETURN_IF_ERROR(norm(l == 0 ? nullptr : delta_.data(), W.input_norm, q[0]));
    LITELLAMA_RETURN_IF_ERROR(project(fp.qkv_gemv, wide_.data(), normed_.data(), W.qkv, W.qkv_w4,
                                      W.qkv_fp8, T, qkv_dim_, H, q[0]));
    LITELLAMA_RETURN_IF_ERROR(run_qkv_rope(plan, l));
    LITELLAMA_RETURN_IF_ERROR(run_attention(plan, l));
    LITELLAMA_RETURN_IF_ERROR(
        project(fp.o_gemv, delta_.data(), attn_.data(), W.o, W.o_w4, W.o_fp8, T, H, q_dim_));
    LITELLAMA_RETURN_IF_ERROR(norm(delta_.data(), W.post_norm, q[2]));
    LITELLAMA_RETURN_IF_ERROR(project(fp.gate_up_linear_gemv, wide_.data(), normed_.data(),
                                      W.gate_up, W.gate_up_w4, W.gate_up_fp8, T, 2 * inter, H,
                                      q[2]));
    LITELLAMA_RETURN_IF_ERROR(
        q[3] ? launch_silu_mul_fp8(fp8_activations_.as<uint8_t>(), fp8_scales_.as<float>(),
                                   wide_.data(), T, inter, dtype_, stream)
             : launch_silu_mul(act_.data(), wide_.data(), T, inter, dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(project(fp.down_gemv, delta_.data(), act_.data(), W.down, W.down_w4,
                                      W.down_fp8, T, H, inter, q[3]));
  }
  return Status::ok();
}

const float* CudaModelRunner::rope_table(const StepPlan& plan) const {
  return plan.dynamic_rope ? staging_device_.as<const float>(plan.layout.freq_table)
                           : rope_inv_freq_.as<const float>();
}

const int32_t* CudaModelRunner::rope_table_rows(const StepPlan& plan) const {
  return plan.dynamic_rope ? staging_device_.as<const int32_t>(plan.layout.token_freq_row)
                           : nullptr;
}

Status CudaModelRunner::run_qkv_rope(const StepPlan& plan, int32_t l) {
  const ModelConfig& c = config_;
  const CudaLayerWeights& W = weights_.layers[static_cast<size_t>(l)];
  return launch_qkv_rope(
      q_.data(), k_pool(l), v_pool(l), wide_.data(), W.qkv_bias, W.q_norm, W.k_norm,
      rope_table(plan), staging_device_.as<const int32_t>(plan.layout.positions),
      staging_device_.as<const int32_t>(plan.layout.token_slot), rope_table_rows(plan),
      plan.n_tokens, c.n_heads, c.n_kv_heads, c.head_dim, rope_attention_scaling_,
      static_cast<float>(c.rms_norm_eps), dtype_, kernel_stream());
}

Status CudaModelRunner::run_attention(const StepPlan& plan, int32_t l) {
  const ModelConfig& c = config_;
  const StepLayout& L = plan.layout;
  const KernelStream stream = kernel_stream();
  auto i32 = [&](size_t offset) { return staging_device_.as<const int32_t>(offset); };
  const int32_t* decode_seqs = i32(L.work_seqs);
  const int32_t* prefill_seqs = decode_seqs + plan.n_decode;
  // The step's tensors with the sequences of one kind of work.
  auto tensors = [&](const int32_t* seq_ids) {
    return AttentionTensors<void>{attn_.data(),
                                  q_.data(),
                                  k_pool(l),
                                  v_pool(l),
                                  i32(L.token_start),
                                  i32(L.kv_len),
                                  i32(L.slot_start),
                                  table_device_.as<const int32_t>(),
                                  seq_ids};
  };
  if (batch_invariant()) {
    if (plan.n_decode > 0) {
      LITELLAMA_RETURN_IF_ERROR(launch_attention_general(tensors(decode_seqs), plan.n_decode, 1,
                                                         c.n_heads, c.n_kv_heads, c.head_dim,
                                                         dtype_, attention_scale_, stream));
    }
    if (plan.n_prefill > 0) {
      LITELLAMA_RETURN_IF_ERROR(launch_attention_general(
          tensors(prefill_seqs), plan.n_prefill, plan.max_prefill_n_new, c.n_heads, c.n_kv_heads,
          c.head_dim, dtype_, attention_scale_, stream));
    }
    return Status::ok();
  }
  if (plan.n_cascade_tasks > 0) {
    const DecodeCascade cascade{i32(L.cascade_n_tasks), i32(L.cascade_tasks),
                                i32(L.cascade_members), i32(L.cascade_part_start),
                                plan.cascade_max_tasks, plan.cascade_max_parts};
    LITELLAMA_RETURN_IF_ERROR(launch_attention_decode_cascade(
        tensors(decode_seqs), cascade, plan.n_decode, c.n_heads, c.n_kv_heads, c.head_dim, dtype_,
        attention_scale_, attention_workspace_.data(), attention_workspace_.size_bytes(), stream));
  } else if (plan.n_decode > 0) {
    LITELLAMA_RETURN_IF_ERROR(launch_attention_decode(
        tensors(decode_seqs), plan.n_decode, plan.max_decode_kv_len, c.n_heads, c.n_kv_heads,
        c.head_dim, dtype_, attention_scale_, n_sms_, attention_workspace_.data(),
        attention_workspace_.size_bytes(), stream));
  }
  if (plan.n_prefill > 0) {
    LITELLAMA_RETURN_IF_ERROR(launch_attention_prefill(
        tensors(prefill_seqs), plan.n_prefill, plan.max_prefill_n_new, c.n_heads, c.n_kv_heads,
        c.head_dim, dtype_, attention_scale_, stream));
  }
  return Status::ok();
}

Status CudaModelRunner::run_head(const StepPlan& plan, const ForwardPlan& fp) {
  const ModelConfig& c = config_;
  const StepLayout& L = plan.layout;
  const KernelStream stream = kernel_stream();
  const auto R = static_cast<int32_t>(plan.sampled_seqs.size());
  const int32_t H = c.hidden_size;
  const int32_t* rows = staging_device_.as<const int32_t>(L.sample_rows);
  // On the cuBLAS path the last layer's residual add happens here, on the sampled rows only (the
  // fused path has added it already). When every token is one sequence's only token and all are
  // sampled, the sampled rows are rows 0..R-1 in order and the norm works on the layer outputs in
  // place (its residual update is the step's last use of the residual; the next step's embedding
  // rewrites it).
  const bool fused = fp.gemv_layers;
  void* residual = residual_.data();
  void* delta = fused ? nullptr : delta_.data();
  if (fp.head_gathers) {
    LITELLAMA_RETURN_IF_ERROR(
        launch_gather_rows(last_residual_.data(), residual_.data(), rows, R, H, dtype_, stream));
    residual = last_residual_.data();
    if (!fused) {
      LITELLAMA_RETURN_IF_ERROR(
          launch_gather_rows(last_delta_.data(), delta_.data(), rows, R, H, dtype_, stream));
      delta = last_delta_.data();
    }
  }
  LITELLAMA_RETURN_IF_ERROR(launch_add_rmsnorm(last_normed_.data(), residual, delta,
                                               weights_.final_norm, R, H,
                                               static_cast<float>(c.rms_norm_eps), dtype_, stream));
  // cuBLAS at every batch size (the tiled kernel where batch_invariant()): the LM head's GEMM
  // streams a matrix that large better than the small-batch GEMV.
  LITELLAMA_RETURN_IF_ERROR(linear(logits_.data(), last_normed_.data(), weights_.lm_head, R,
                                   c.vocab_size, H, DType::kF32));
  return run_sampling(plan, fp);
}

Status CudaModelRunner::run_sampling(const StepPlan& plan, const ForwardPlan& fp) {
  const int32_t n_top = fp.n_top;
  const ModelConfig& c = config_;
  const StepLayout& L = plan.layout;
  const auto R = static_cast<int32_t>(plan.sampled_seqs.size());
  auto* sampled = results_.as<int32_t>();
  int32_t* top_ids = sampled + R;
  auto* top_values = reinterpret_cast<float*>(top_ids + R * n_top);
  SamplingLogprobs logprobs;
  if (plan.logprobs) {
    // The scratch is the second half of the history buffer (step() sizes it for that); its
    // address, like the results', depends only on what keys a graph.
    logprobs.logprobs = top_values + R * n_top;
    logprobs.lse = logprobs.logprobs + R;
    logprobs.history_raw = reinterpret_cast<float*>(static_cast<char*>(history_device_.data()) +
                                                    history_device_.size_bytes() / 2 / 4 * 4);
  }
  return launch_sampling(sampled, top_ids, top_values, logits_.as<float>(),
                         staging_device_.as<const SamplingRow>(L.sampling_rows),
                         history_device_.as<const int32_t>(), R, c.vocab_size, n_top,
                         token_marks_.as<int32_t>(), kernel_stream(), plan.greedy_only,
                         /*max_ctas_per_row=*/0, logprobs);
}

Status check_supported(const ModelConfig& c, const RunnerOptions& options) {
  const DType dt = options.compute_dtype;
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) {
    return make_error(StatusCode::kUnsupported,
                      "the CUDA backend computes in float32, bfloat16 or float16 (got {})",
                      dtype_torch_name(dt));
  }
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    return make_error(StatusCode::kUnsupported, "n_heads {} is not a multiple of n_kv_heads {}",
                      c.n_heads, c.n_kv_heads);
  }
  if (!qkv_rope_supports(c.head_dim, dt) ||
      !attention_prefill_supports(dt, c.head_dim, c.n_heads, c.n_kv_heads) ||
      !attention_decode_supports(dt, c.head_dim, c.n_heads, c.n_kv_heads)) {
    return make_error(StatusCode::kUnsupported,
                      "the CUDA backend does not support head_dim {} with {} query / {} KV heads "
                      "in {}",
                      c.head_dim, c.n_heads, c.n_kv_heads, dtype_torch_name(dt));
  }
  if (!embedding_supports(dt) || !add_rmsnorm_supports(dt) || !silu_mul_supports(dt) ||
      !gather_rows_supports(dt) || !linear_supports(dt, dt) || !linear_supports(dt, DType::kF32)) {
    return make_error(StatusCode::kUnsupported, "the CUDA backend does not support {} here",
                      dtype_torch_name(dt));
  }
  if (!sampling_supports(c.vocab_size, 0)) {
    return make_error(StatusCode::kUnsupported,
                      "the CUDA sampler takes vocabularies of up to {} entries (the model has {})",
                      kSamplingMaxVocab, c.vocab_size);
  }
  if (options.max_batch_tokens <= 0 || options.max_batch_seqs <= 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "max_batch_tokens and max_batch_seqs must be positive");
  }
#if LITELLAMA_PROFILING
  const LayerKernelRepeats& r = options.layer_kernel_repeats;
  for (int32_t count : {r.qkv, r.attention, r.o, r.post_norm, r.gate_up, r.down}) {
    if (count < 0 || count > 2) {
      return make_error(StatusCode::kInvalidArgument,
                        "layer_kernel_repeats: counts are 0, 1 or 2 (got {})", count);
    }
  }
  // The repeats act on the fused (GEMV) layer path only; a model whose layer widths that path
  // does not take would ignore them, so a profile of it would measure nothing: refused instead.
  const int32_t q_dim = c.n_heads * c.head_dim;
  if (r != LayerKernelRepeats{} &&
      !(options.gemv_max_tokens > 0 && gemv_supports(dt, dt, 1, c.hidden_size) &&
        gemv_supports(dt, dt, 1, q_dim) && gemv_supports(dt, dt, 1, c.intermediate_size))) {
    return make_error(StatusCode::kInvalidArgument,
                      "layer_kernel_repeats act on the GEMV layer path, which this model (hidden "
                      "{}, query width {}, intermediate {}) or gemv_max_tokens {} does not take",
                      c.hidden_size, q_dim, c.intermediate_size, options.gemv_max_tokens);
  }
#endif
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> create_cuda_model_runner(const Checkpoint& checkpoint,
                                                              const RunnerOptions& options) {
  int n_devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&n_devices);
  if (err != cudaSuccess || n_devices == 0) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return make_error(StatusCode::kUnavailable, "no CUDA device ({})",
                      err != cudaSuccess ? cudaGetErrorString(err) : "none found");
  }
  LITELLAMA_RETURN_IF_ERROR(check_supported(checkpoint.config(), options));
  auto runner = std::make_unique<CudaModelRunner>(checkpoint.config(), options);
  LITELLAMA_RETURN_IF_ERROR(runner->init(checkpoint));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace litellama
