// The element-wise ends of the GEMV variants (gemv.h), applied to one (row, token) float32 sum
// after its reduction: shared by the tensor-core kernel (gemv_impl.cuh) and the portable one
// (gemv_portable.cuh), so that both round exactly as the unfused kernels they replace do. Each
// function takes the finished sums; how they were summed is the kernel's business.
#pragma once

#include <cstdint>

#include "kernels/gemv.h"
#include "kernels/kernel_common.cuh"

namespace litellama::gemv_epilogue {

// 1 / sqrt(mean(x_row^2) + eps) from the row's sum of squares over k elements, correctly rounded
// as add_rmsnorm computes it (GemvRmsNorm).
__device__ __forceinline__ float inv_rms(float sum_squares, int32_t k, float eps) {
  return __frcp_rn(__fsqrt_rn(sum_squares / static_cast<float>(k) + eps));
}

// kResidualAdd: y = round(y + round(sum)), add_rmsnorm's residual update of one element.
template <typename T>
__device__ __forceinline__ void residual_add(T* y, float sum) {
  *y = from_float<T>(to_float(*y) + to_float(from_float<T>(sum)));
}

// kSiluMul: silu(round(gate)) * round(up), as the linear layer stores gate/up in T and silu_mul
// reads them.
template <typename T>
__device__ __forceinline__ T silu_mul(float gate_sum, float up_sum) {
  const float gate = to_float(from_float<T>(gate_sum));
  const float up = to_float(from_float<T>(up_sum));
  return from_float<T>(gate / (1.0f + expf(-gate)) * up);
}

// kRope: qkv_rope_kernel's epilogue (no q/k RMSNorm) for element j of the first half of `head`
// (of n_heads + 2 n_kv_heads) and its partner half + j, from their sums for `token`: round both
// to T, add the bias, then store V as is, or rotate Q / K (rotate-half RoPE at the token's
// position, scaled by attention_scaling) into q_out or the token's K-pool slot.
template <typename T>
__device__ __forceinline__ void rope_store(const GemvRope& rope, int head, int j, int token,
                                           float lo_sum, float hi_sum) {
  const int half = rope.head_dim / 2;
  float lo = to_float(from_float<T>(lo_sum));
  float hi = to_float(from_float<T>(hi_sum));
  if (rope.bias != nullptr) {
    lo += rope.bias[static_cast<int64_t>(head) * rope.head_dim + j];
    hi += rope.bias[static_cast<int64_t>(head) * rope.head_dim + half + j];
  }
  const int64_t slot = rope.token_slot[token];
  if (head >= rope.n_heads + rope.n_kv_heads) {
    T* dst = static_cast<T*>(rope.v_pool) +
             (slot * rope.n_kv_heads + (head - rope.n_heads - rope.n_kv_heads)) * rope.head_dim;
    dst[j] = from_float<T>(lo);
    dst[half + j] = from_float<T>(hi);
    return;
  }
  const float pos = static_cast<float>(rope.positions[token]);
  const int freq_row = rope.token_freq_row != nullptr ? rope.token_freq_row[token] : 0;
  const float angle = pos * rope.inv_freq[static_cast<int64_t>(freq_row) * half + j];
  float s, c;
  sincosf(angle, &s, &c);
  c *= rope.attention_scaling;
  s *= rope.attention_scaling;
  T* dst = head < rope.n_heads
               ? static_cast<T*>(rope.q_out) +
                     (static_cast<int64_t>(token) * rope.n_heads + head) * rope.head_dim
               : static_cast<T*>(rope.k_pool) +
                     (slot * rope.n_kv_heads + (head - rope.n_heads)) * rope.head_dim;
  dst[j] = from_float<T>(__fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s)));
  dst[half + j] = from_float<T>(__fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s)));
}

}  // namespace litellama::gemv_epilogue
