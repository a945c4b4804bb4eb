// One warp per (token, head of [q | k | v]). Each lane holds some rotary pairs (element j of the
// first half of the head and its rotate-half partner j + head_dim / 2), so RoPE needs no shuffles
// and the per-head RMSNorm is one warp sum. Which pairs a lane holds is the kernel's one template
// choice: head sizes 64, 128 and 256 give lane l the contiguous pairs l*VH .. l*VH+VH-1
// (VH = head_dim / 64), compiled per size; any other even size up to 256 strides the pairs over
// the lanes (j = l, l + 32, ...). The arithmetic is the same element by element.
#include "kernels/qkv_rope.h"

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kWarpsPerBlock = 4;

// The tuned layout: lane l holds pairs l*kPerLane .. l*kPerLane + kPerLane - 1 of kHeadDim.
template <int kHeadDim>
struct ContiguousPairs {
  static constexpr int kPerLane = kHeadDim / 64;
  __device__ __forceinline__ int head_dim() const { return kHeadDim; }
  __device__ __forceinline__ int pair(int lane, int r) const { return lane * kPerLane + r; }
  __device__ __forceinline__ bool holds(int) const { return true; }
};

// Any even head size up to 64 * kMaxPairsPerLane: lane l holds pairs j = l + 32 r below half.
constexpr int kMaxPairsPerLane = 4;

struct StridedPairs {
  static constexpr int kPerLane = kMaxPairsPerLane;
  int dim;
  __device__ __forceinline__ int head_dim() const { return dim; }
  __device__ __forceinline__ int pair(int lane, int r) const { return lane + 32 * r; }
  __device__ __forceinline__ bool holds(int j) const { return j < dim / 2; }
};

template <typename T, typename Pairs>
__global__ void qkv_rope_kernel(
    T* __restrict__ q_out, T* __restrict__ k_pool, T* __restrict__ v_pool,
    const T* __restrict__ qkv, const float* __restrict__ qkv_bias,
    const float* __restrict__ q_norm_weight, const float* __restrict__ k_norm_weight,
    const float* __restrict__ inv_freq, const int32_t* __restrict__ positions,
    const int32_t* __restrict__ token_slot, const int32_t* __restrict__ token_freq_row,
    int n_tokens, int n_heads, int n_kv_heads, Pairs pairs, float attention_scaling,
    float norm_eps) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int N = Pairs::kPerLane;
  const int head_dim = pairs.head_dim();
  const int half = head_dim / 2;
  const int n_heads_total = n_heads + 2 * n_kv_heads;
  const int64_t work = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (work >= static_cast<int64_t>(n_tokens) * n_heads_total) return;
  const int t = static_cast<int>(work / n_heads_total);
  const int h = static_cast<int>(work - static_cast<int64_t>(t) * n_heads_total);
  const int lane = threadIdx.x & 31;

  const T* src = qkv + work * head_dim;
  float lo[N], hi[N];
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const int j = pairs.pair(lane, r);
    lo[r] = pairs.holds(j) ? to_float(src[j]) : 0.0f;
    hi[r] = pairs.holds(j) ? to_float(src[half + j]) : 0.0f;
    if (qkv_bias != nullptr && pairs.holds(j)) {
      const float* b = qkv_bias + static_cast<int64_t>(h) * head_dim;
      lo[r] += b[j];
      hi[r] += b[half + j];
    }
  }

  const int64_t slot = token_slot[t];
  if (h >= n_heads + n_kv_heads) {  // v: straight into the pool
    T* dst = v_pool + (slot * n_kv_heads + (h - n_heads - n_kv_heads)) * head_dim;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const int j = pairs.pair(lane, r);
      if (!pairs.holds(j)) continue;
      dst[j] = from_float<T>(lo[r]);
      dst[half + j] = from_float<T>(hi[r]);
    }
    return;
  }

  const bool is_q = h < n_heads;
  const float* norm_weight = is_q ? q_norm_weight : k_norm_weight;
  if (norm_weight != nullptr) {
    float sum_sq = 0.0f;  // pairs a lane does not hold are zero
#pragma unroll
    for (int r = 0; r < N; ++r) sum_sq += lo[r] * lo[r] + hi[r] * hi[r];
    const float inv_rms =
        __frcp_rn(__fsqrt_rn(warp_sum(sum_sq) / static_cast<float>(head_dim) + norm_eps));
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const int j = pairs.pair(lane, r);
      if (!pairs.holds(j)) continue;
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
  for (int r = 0; r < N; ++r) {
    const int j = pairs.pair(lane, r);
    if (!pairs.holds(j)) continue;
    float s, c;
    sincosf(pos * freq[j], &s, &c);
    c *= attention_scaling;
    s *= attention_scaling;
    const float x0 = lo[r], x1 = hi[r];
    dst[j] = from_float<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    dst[half + j] = from_float<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
  }
}

template <typename T, typename Pairs>
Status launch_with(Pairs pairs, void* q_out, void* k_pool, void* v_pool, const void* qkv,
                   const float* qkv_bias, const float* q_norm_weight, const float* k_norm_weight,
                   const float* inv_freq, const int32_t* positions, const int32_t* token_slot,
                   const int32_t* token_freq_row, int32_t n_tokens, int32_t n_heads,
                   int32_t n_kv_heads, float attention_scaling, float norm_eps,
                   KernelStream stream) {
  const int64_t work = static_cast<int64_t>(n_tokens) * (n_heads + 2 * n_kv_heads);
  const int64_t blocks = ceil_div<int64_t>(work, kWarpsPerBlock);
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
      qkv_rope_kernel<T, Pairs>, dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32), 0,
      stream, static_cast<T*>(q_out), static_cast<T*>(k_pool), static_cast<T*>(v_pool),
      static_cast<const T*>(qkv), qkv_bias, q_norm_weight, k_norm_weight, inv_freq, positions,
      token_slot, token_freq_row, n_tokens, n_heads, n_kv_heads, pairs, attention_scaling,
      norm_eps));
  return Status::ok();
}

// The pair layout for head_dim: a tuned one for 64, 128 and 256, else the strided one.
template <typename F>
Status dispatch_pairs(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(ContiguousPairs<64>{});
    case 128:
      return f(ContiguousPairs<128>{});
    case 256:
      return f(ContiguousPairs<256>{});
    default:
      if (!qkv_rope_supports(head_dim, DType::kF32)) {
        return make_error(StatusCode::kUnsupported, "qkv_rope: unsupported head_dim {}", head_dim);
      }
      return f(StridedPairs{head_dim});
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
    return dispatch_pairs(head_dim, [&](auto pairs) {
      return launch_with<typename decltype(type)::type>(
          pairs, q_out, k_pool, v_pool, qkv, qkv_bias, q_norm_weight, k_norm_weight, inv_freq,
          positions, token_slot, token_freq_row, n_tokens, n_heads, n_kv_heads, attention_scaling,
          norm_eps, stream);
    });
  });
}

}  // namespace litellama
