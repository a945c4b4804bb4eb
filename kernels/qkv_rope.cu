// One warp per (token, head of [q | k | v]). Lane l holds elements l*VH .. l*VH+VH-1 of the first
// half of the head and their rotate-half partners in the second half (VH = head_dim / 64), so
// RoPE needs no shuffles and the per-head RMSNorm is one warp sum. Head sizes that are not 64,
// 128 or 256 take the general kernel below, which strides the pairs over the lanes instead.
#include "kernels/qkv_rope.h"

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T, int kHeadDim>
__global__ void qkv_rope_kernel(
    T* __restrict__ q_out, T* __restrict__ k_pool, T* __restrict__ v_pool,
    const T* __restrict__ qkv, const float* __restrict__ qkv_bias,
    const float* __restrict__ q_norm_weight, const float* __restrict__ k_norm_weight,
    const float* __restrict__ inv_freq, const int32_t* __restrict__ positions,
    const int32_t* __restrict__ token_slot, const int32_t* __restrict__ token_freq_row,
    int n_tokens, int n_heads, int n_kv_heads, float attention_scaling, float norm_eps) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int kHalf = kHeadDim / 2;
  constexpr int VH = kHeadDim / 64;
  const int n_heads_total = n_heads + 2 * n_kv_heads;
  const int64_t work = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (work >= static_cast<int64_t>(n_tokens) * n_heads_total) return;
  const int t = static_cast<int>(work / n_heads_total);
  const int h = static_cast<int>(work - static_cast<int64_t>(t) * n_heads_total);
  const int lane = threadIdx.x & 31;

  const T* src = qkv + work * kHeadDim;
  float lo[VH], hi[VH];
#pragma unroll
  for (int j = 0; j < VH; ++j) {
    lo[j] = to_float(src[lane * VH + j]);
    hi[j] = to_float(src[kHalf + lane * VH + j]);
  }
  if (qkv_bias != nullptr) {
    const float* b = qkv_bias + static_cast<int64_t>(h) * kHeadDim;
#pragma unroll
    for (int j = 0; j < VH; ++j) {
      lo[j] += b[lane * VH + j];
      hi[j] += b[kHalf + lane * VH + j];
    }
  }

  const int64_t slot = token_slot[t];
  if (h >= n_heads + n_kv_heads) {  // v: straight into the pool
    T* dst = v_pool + (slot * n_kv_heads + (h - n_heads - n_kv_heads)) * kHeadDim;
#pragma unroll
    for (int j = 0; j < VH; ++j) {
      dst[lane * VH + j] = from_float<T>(lo[j]);
      dst[kHalf + lane * VH + j] = from_float<T>(hi[j]);
    }
    return;
  }

  const bool is_q = h < n_heads;
  const float* norm_weight = is_q ? q_norm_weight : k_norm_weight;
  if (norm_weight != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < VH; ++j) sum_sq += lo[j] * lo[j] + hi[j] * hi[j];
    const float inv_rms =
        __frcp_rn(__fsqrt_rn(warp_sum(sum_sq) / static_cast<float>(kHeadDim) + norm_eps));
#pragma unroll
    for (int j = 0; j < VH; ++j) {
      lo[j] = lo[j] * inv_rms * norm_weight[lane * VH + j];
      hi[j] = hi[j] * inv_rms * norm_weight[kHalf + lane * VH + j];
    }
  }

  const float pos = static_cast<float>(positions[t]);
  const int freq_row = token_freq_row != nullptr ? token_freq_row[t] : 0;
  const float* freq = inv_freq + static_cast<int64_t>(freq_row) * kHalf;
  T* dst = is_q ? q_out + (static_cast<int64_t>(t) * n_heads + h) * kHeadDim
                : k_pool + (slot * n_kv_heads + (h - n_heads)) * kHeadDim;
#pragma unroll
  for (int j = 0; j < VH; ++j) {
    const float angle = pos * freq[lane * VH + j];
    float s, c;
    sincosf(angle, &s, &c);
    c *= attention_scaling;
    s *= attention_scaling;
    const float x0 = lo[j], x1 = hi[j];
    dst[lane * VH + j] = from_float<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    dst[kHalf + lane * VH + j] = from_float<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
  }
}

// Any even head size up to 256: lane l holds rotary pairs (j, j + head_dim / 2) for j = l, l + 32,
// ... (at most kMaxPairsPerLane of them), so the same warp-per-head scheme serves head sizes that
// are not a multiple of 64. The arithmetic is the tuned kernel's, element by element.
constexpr int kMaxPairsPerLane = 4;

template <typename T>
__global__ void qkv_rope_general_kernel(
    T* __restrict__ q_out, T* __restrict__ k_pool, T* __restrict__ v_pool,
    const T* __restrict__ qkv, const float* __restrict__ qkv_bias,
    const float* __restrict__ q_norm_weight, const float* __restrict__ k_norm_weight,
    const float* __restrict__ inv_freq, const int32_t* __restrict__ positions,
    const int32_t* __restrict__ token_slot, const int32_t* __restrict__ token_freq_row,
    int n_tokens, int n_heads, int n_kv_heads, int head_dim, float attention_scaling,
    float norm_eps) {
  pdl_launch_dependents();
  pdl_wait();
  const int half = head_dim / 2;
  const int n_heads_total = n_heads + 2 * n_kv_heads;
  const int64_t work = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (work >= static_cast<int64_t>(n_tokens) * n_heads_total) return;
  const int t = static_cast<int>(work / n_heads_total);
  const int h = static_cast<int>(work - static_cast<int64_t>(t) * n_heads_total);
  const int lane = threadIdx.x & 31;

  const T* src = qkv + work * head_dim;
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
#pragma unroll
  for (int r = 0; r < kMaxPairsPerLane; ++r) {
    const int j = lane + 32 * r;
    lo[r] = j < half ? to_float(src[j]) : 0.0f;
    hi[r] = j < half ? to_float(src[half + j]) : 0.0f;
    if (qkv_bias != nullptr && j < half) {
      const float* b = qkv_bias + static_cast<int64_t>(h) * head_dim;
      lo[r] += b[j];
      hi[r] += b[half + j];
    }
  }

  const int64_t slot = token_slot[t];
  if (h >= n_heads + n_kv_heads) {  // v: straight into the pool
    T* dst = v_pool + (slot * n_kv_heads + (h - n_heads - n_kv_heads)) * head_dim;
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) {
      const int j = lane + 32 * r;
      if (j >= half) continue;
      dst[j] = from_float<T>(lo[r]);
      dst[half + j] = from_float<T>(hi[r]);
    }
    return;
  }

  const bool is_q = h < n_heads;
  const float* norm_weight = is_q ? q_norm_weight : k_norm_weight;
  if (norm_weight != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) sum_sq += lo[r] * lo[r] + hi[r] * hi[r];
    const float inv_rms =
        __frcp_rn(__fsqrt_rn(warp_sum(sum_sq) / static_cast<float>(head_dim) + norm_eps));
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) {
      const int j = lane + 32 * r;
      if (j >= half) continue;
      lo[r] = lo[r] * inv_rms * norm_weight[j];
      hi[r] = hi[r] * inv_rms * norm_weight[half + j];
    }
  }

  const float pos = static_cast<float>(positions[t]);
  const int freq_row = token_freq_row != nullptr ? token_freq_row[t] : 0;
  const float* freq = inv_freq + static_cast<int64_t>(freq_row) * half;
  T* dst = is_q ? q_out + (static_cast<int64_t>(t) * n_heads + h) * head_dim
                : k_pool + (slot * n_kv_heads + (h - n_heads)) * head_dim;
#pragma unroll
  for (int r = 0; r < kMaxPairsPerLane; ++r) {
    const int j = lane + 32 * r;
    if (j >= half) continue;
    float s, c;
    sincosf(pos * freq[j], &s, &c);
    c *= attention_scaling;
    s *= attention_scaling;
    const float x0 = lo[r], x1 = hi[r];
    dst[j] = from_float<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    dst[half + j] = from_float<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
  }
}

template <typename T>
Status launch_general(int32_t head_dim, void* q_out, void* k_pool, void* v_pool, const void* qkv,
                      const float* qkv_bias, const float* q_norm_weight, const float* k_norm_weight,
                      const float* inv_freq, const int32_t* positions, const int32_t* token_slot,
                      const int32_t* token_freq_row, int32_t n_tokens, int32_t n_heads,
                      int32_t n_kv_heads, float attention_scaling, float norm_eps,
                      KernelStream stream) {
  const int64_t work = static_cast<int64_t>(n_tokens) * (n_heads + 2 * n_kv_heads);
  const int64_t blocks = ceil_div<int64_t>(work, kWarpsPerBlock);
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
      qkv_rope_general_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32), 0,
      stream, static_cast<T*>(q_out), static_cast<T*>(k_pool), static_cast<T*>(v_pool),
      static_cast<const T*>(qkv), qkv_bias, q_norm_weight, k_norm_weight, inv_freq, positions,
      token_slot, token_freq_row, n_tokens, n_heads, n_kv_heads, head_dim, attention_scaling,
      norm_eps));
  return Status::ok();
}

template <typename T, int kHeadDim>
Status launch_hd(void* q_out, void* k_pool, void* v_pool, const void* qkv, const float* qkv_bias,
                 const float* q_norm_weight, const float* k_norm_weight, const float* inv_freq,
                 const int32_t* positions, const int32_t* token_slot, const int32_t* token_freq_row,
                 int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, float attention_scaling,
                 float norm_eps, KernelStream stream) {
  const int64_t work = static_cast<int64_t>(n_tokens) * (n_heads + 2 * n_kv_heads);
  const int64_t blocks = ceil_div<int64_t>(work, kWarpsPerBlock);
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
      qkv_rope_kernel<T, kHeadDim>, dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32),
      0, stream, static_cast<T*>(q_out), static_cast<T*>(k_pool), static_cast<T*>(v_pool),
      static_cast<const T*>(qkv), qkv_bias, q_norm_weight, k_norm_weight, inv_freq, positions,
      token_slot, token_freq_row, n_tokens, n_heads, n_kv_heads, attention_scaling, norm_eps));
  return Status::ok();
}

template <typename T>
Status launch_typed(int32_t head_dim, void* q_out, void* k_pool, void* v_pool, const void* qkv,
                    const float* qkv_bias, const float* q_norm_weight, const float* k_norm_weight,
                    const float* inv_freq, const int32_t* positions, const int32_t* token_slot,
                    const int32_t* token_freq_row, int32_t n_tokens, int32_t n_heads,
                    int32_t n_kv_heads, float attention_scaling, float norm_eps,
                    KernelStream stream) {
  switch (head_dim) {
    case 64:
      return launch_hd<T, 64>(q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight, k_norm_weight,
                              inv_freq, positions, token_slot, token_freq_row, n_tokens, n_heads,
                              n_kv_heads, attention_scaling, norm_eps, stream);
    case 128:
      return launch_hd<T, 128>(q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight, k_norm_weight,
                               inv_freq, positions, token_slot, token_freq_row, n_tokens, n_heads,
                               n_kv_heads, attention_scaling, norm_eps, stream);
    case 256:
      return launch_hd<T, 256>(q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight, k_norm_weight,
                               inv_freq, positions, token_slot, token_freq_row, n_tokens, n_heads,
                               n_kv_heads, attention_scaling, norm_eps, stream);
    default:
      if (!qkv_rope_supports(head_dim, DType::kF32)) {
        return make_error(StatusCode::kUnsupported, "qkv_rope: unsupported head_dim {}", head_dim);
      }
      return launch_general<T>(head_dim, q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight,
                               k_norm_weight, inv_freq, positions, token_slot, token_freq_row,
                               n_tokens, n_heads, n_kv_heads, attention_scaling, norm_eps, stream);
  }
}

}  // namespace

bool qkv_rope_supports(int32_t head_dim, DType dtype) {
  return is_float_compute_dtype(dtype) && head_dim >= 2 && head_dim % 2 == 0 &&
         head_dim <= 64 * kMaxPairsPerLane;
}

Status launch_qkv_rope(void* q_out, void* k_pool, void* v_pool, const void* qkv,
                       const float* qkv_bias, const float* q_norm_weight,
                       const float* k_norm_weight, const float* inv_freq, const int32_t* positions,
                       const int32_t* token_slot, const int32_t* token_freq_row, int32_t n_tokens,
                       int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                       float attention_scaling, float norm_eps, DType dtype, KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "qkv_rope", [&](auto type) {
    return launch_typed<typename decltype(type)::type>(
        head_dim, q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight, k_norm_weight, inv_freq,
        positions, token_slot, token_freq_row, n_tokens, n_heads, n_kv_heads, attention_scaling,
        norm_eps, stream);
  });
}

}  // namespace litellama
