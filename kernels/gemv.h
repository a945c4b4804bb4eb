// Small-batch linear layers on tensor cores: y[m, n] = x[m, k] @ w[n, k]^T for m <= 8 rows of x
// (the decode batches), bf16/fp16 weights and activations, float32 accumulation. Memory-bound by
// design: every weight byte is read once with 16-byte loads, the first of them before the kernel
// waits for its input (programmatic dependent launch, kernels/launch.h), so the weight stream of
// one layer overlaps the previous kernel.
//
// The variants fold element-wise work after a decode layer's linear layers into them, which
// removes kernels from the step: store (in the compute dtype or float32), add into the residual
// stream, SiLU(gate) * up of the gate/up projection, or the QKV epilogue of qkv_rope (bias, RoPE,
// K/V into the pool; models without q/k RMSNorm).
//
// Per linear layer, back to back, they beat cuBLAS on most decode shapes (bench/linear_bench.cu).
// In the decode step the runner uses them for QKV, o and down at small batches
// (RunnerOptions::gemv_max_tokens), and the SiLU variant for gate/up at batch 1 to 8 of small
// models (RunnerOptions::gemv_gate_up_max_tokens). The LM head goes through cuBLAS, whose GEMM
// streams a matrix that large better than this kernel.
//
// Portable builds (LITELLAMA_PORTABLE_KERNELS, every HIP build) run a SIMT kernel of the same
// variants, shapes and rounding instead (kernels/gemv_portable.cuh), so the runner plans the same
// decode step on both.
#pragma once

#include <cstdint>
#include <optional>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

inline constexpr int32_t kGemvMaxRows = 8;

// True when the variants run this shape: dtype bf16 or fp16, out_dtype dtype or float32,
// 1 <= m <= kGemvMaxRows, k a multiple of 64.
bool gemv_supports(DType dtype, DType out_dtype, int32_t m, int32_t k);

Status launch_gemv(void* y,        // [m, n] of out_dtype
                   const void* x,  // [m, k] of dtype
                   const void* w,  // [n, k] of dtype
                   int32_t m, int32_t n, int32_t k, DType dtype, DType out_dtype,
                   KernelStream stream);

// residual[m, n] = round(residual + round(x @ w^T)): the projection and the residual add of
// add_rmsnorm in one pass (n = hidden size).
Status launch_gemv_residual_add(void* residual, const void* x, const void* w, int32_t m, int32_t n,
                                int32_t k, DType dtype, KernelStream stream);

// The k segments launch_gemv_residual_add runs this shape with on the current device (gemv.cu's
// policy; 1: none), for tests and profiling. 0 where the shape is not supported.
int32_t gemv_residual_add_k_segments(DType dtype, int32_t m, int32_t n, int32_t k);

// The gate/up projection with its activation: act[m, inter] = silu(g) * u, where g and u are the
// rows of x @ [w_gate; w_up]^T (w_gate_up is [2 * inter, k]), each rounded to dtype first, as the
// separate linear + silu_mul kernels compute it.
Status launch_gemv_silu_mul(void* act, const void* x, const void* w_gate_up, int32_t m,
                            int32_t inter, int32_t k, DType dtype, KernelStream stream);

// The RMSNorm before a projection, folded into it. The caller has multiplied every column j of
// w by the norm's weight[j] (the CUDA runner loads its q/k/v weights that way); x is the
// un-normalized residual stream, and the kernel scales each row's sums by
// 1 / sqrt(mean(x_row^2) + eps), with the sums of squares taken from the x it reads anyway. Equal
// to rmsnorm(x) @ w^T up to rounding: the norm's output is not rounded to dtype, the folded
// weights are.
struct GemvRmsNorm {
  float eps = 1e-5f;
};

// The QKV projection with qkv_rope's epilogue (kernels/qkv_rope.h, without q/k RMSNorm): rows of
// w_qkv are [n_heads + 2 n_kv_heads] heads of head_dim; q goes to q_out, k (rotated) and v to the
// token's slot of the pools. With `norm`, x is the residual stream before the layer's input
// RMSNorm (see GemvRmsNorm), which then needs no kernel of its own.
struct GemvRope {
  void* q_out;                    // [m, n_heads, head_dim]
  void* k_pool;                   // [n_slots, n_kv_heads, head_dim]
  void* v_pool;                   // [n_slots, n_kv_heads, head_dim]
  const float* bias;              // [n_heads + 2 n_kv_heads, head_dim] or null
  const float* inv_freq;          // [n_freq_rows, head_dim / 2]
  const int32_t* positions;       // [m]
  const int32_t* token_slot;      // [m]
  const int32_t* token_freq_row;  // [m] or null (all row 0)
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  float attention_scaling;
};
// The head sizes the rope epilogue is tested at (64 and 128, those of the tuned attention
// kernels); other sizes run the QKV projection and qkv_rope's kernel separately.
bool gemv_rope_supports(int32_t head_dim);
Status launch_gemv_qkv_rope(const GemvRope& rope, const void* x, const void* w_qkv, int32_t m,
                            int32_t k, DType dtype, KernelStream stream,
                            std::optional<GemvRmsNorm> norm = std::nullopt);

}  // namespace litellama
