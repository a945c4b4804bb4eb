// The general attention path (see attention_general.h). Lane l of a warp holds elements
// l, l + 32, ... of the head (kVpl = ceil(head_dim / 32) of them), so loads are coalesced for any
// head size and a q.k product is one warp sum. Warp w of the CTA takes keys w, w + kWarps, ...;
// each keeps its own running max, sum and weighted values, and warp 0 merges them at the end.
#include "kernels/attention_general.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention_common.cuh"
#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Untyped pointers: the kernel casts them to its storage type T.
struct Params : AttentionTensors<void> {
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  float scale;
};

template <typename T, int kVpl>
__global__ void __launch_bounds__(kThreads) attention_general_kernel(Params p) {
  // Nothing here is a weight: every read waits for the kernel before (kernels/launch.h).
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float warp_max_score[kWarps];
  __shared__ float warp_sum_exp[kWarps];
  __shared__ float warp_acc[kWarps][kVpl * 32];

  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int s = p.seq_ids[blockIdx.y];
  const int h = static_cast<int>(blockIdx.z);
  const int kv_head = h / (p.n_heads / p.n_kv_heads);
  const int D = p.head_dim;
  const int token0 = p.token_start[s];
  const int n_new = p.token_start[s + 1] - token0;
  const int kv_len = p.kv_len[s];
  const int32_t* slots = p.slot_table + p.slot_start[s];
  const T* q = static_cast<const T*>(p.q);
  const T* k_pool = static_cast<const T*>(p.k_pool);
  const T* v_pool = static_cast<const T*>(p.v_pool);
  T* out = static_cast<T*>(p.out);

  for (int i = static_cast<int>(blockIdx.x); i < n_new; i += static_cast<int>(gridDim.x)) {
    const int64_t row = (static_cast<int64_t>(token0) + i) * p.n_heads + h;
    float qv[kVpl];
#pragma unroll
    for (int j = 0; j < kVpl; ++j) {
      const int d = lane + 32 * j;
      qv[j] = d < D ? to_float(q[row * D + d]) : 0.0f;
    }
    // Causal: the token at position kv_len - n_new + i sees positions 0 .. that position.
    const int n_keys = kv_len - n_new + i + 1;
    float m = -INFINITY;
    float l = 0.0f;
    float acc[kVpl];
#pragma unroll
    for (int j = 0; j < kVpl; ++j) acc[j] = 0.0f;
    for (int key = warp; key < n_keys; key += kWarps) {
      const int64_t base = (static_cast<int64_t>(slots[key]) * p.n_kv_heads + kv_head) * D;
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kVpl; ++j) {
        const int d = lane + 32 * j;
        if (d < D) dot = fmaf(qv[j], to_float(k_pool[base + d]), dot);
      }
      const float score = warp_sum(dot) * p.scale;
      const float m_new = fmaxf(m, score);
      const float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
      const float weight = expf(score - m_new);
      l = fmaf(l, correction, weight);
#pragma unroll
      for (int j = 0; j < kVpl; ++j) {
        const int d = lane + 32 * j;
        const float v = d < D ? to_float(v_pool[base + d]) : 0.0f;
        acc[j] = fmaf(acc[j], correction, weight * v);
      }
      m = m_new;
    }
    if (lane == 0) {
      warp_max_score[warp] = m;
      warp_sum_exp[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < kVpl; ++j) warp_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    if (warp == 0) {
      // Key 0 always exists and belongs to warp 0, so the overall max is finite; a warp that got
      // no key has max -inf and weight 0.
      float m_all = warp_max_score[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) m_all = fmaxf(m_all, warp_max_score[w]);
      float weights[kWarps];
      float l_all = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        weights[w] = expf(warp_max_score[w] - m_all);
        l_all = fmaf(warp_sum_exp[w], weights[w], l_all);
      }
      const float inv_l = 1.0f / l_all;
#pragma unroll
      for (int j = 0; j < kVpl; ++j) {
        const int d = lane + 32 * j;
        if (d >= D) continue;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) o = fmaf(warp_acc[w][d], weights[w], o);
        out[row * D + d] = from_float<T>(o * inv_l);
      }
    }
    __syncthreads();  // the shared arrays are rewritten by the next token
  }
}

template <typename T, int kVpl>
Status launch_vpl(const Params& p, int32_t n_work, int32_t max_n_new, KernelStream stream) {
  const dim3 grid(static_cast<unsigned>(std::clamp(max_n_new, 1, 65535)),
                  static_cast<unsigned>(n_work), static_cast<unsigned>(p.n_heads));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel(attention_general_kernel<T, kVpl>, grid, dim3(kThreads), 0, stream, p));
  return Status::ok();
}

// The runtime head size becomes this kernel's values per lane here (dtype: dispatch_float_dtype).
template <typename T>
Status dispatch_vpl(const Params& p, int32_t n_work, int32_t max_n_new, KernelStream stream) {
  switch (ceil_div(p.head_dim, 32)) {
    case 1:
      return launch_vpl<T, 1>(p, n_work, max_n_new, stream);
    case 2:
      return launch_vpl<T, 2>(p, n_work, max_n_new, stream);
    case 3:
      return launch_vpl<T, 3>(p, n_work, max_n_new, stream);
    case 4:
      return launch_vpl<T, 4>(p, n_work, max_n_new, stream);
    case 5:
    case 6:
      return launch_vpl<T, 6>(p, n_work, max_n_new, stream);
    case 7:
    case 8:
      return launch_vpl<T, 8>(p, n_work, max_n_new, stream);
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "attention_general: head_dim {} not supported",
                    p.head_dim);
}

}  // namespace

bool attention_general_supports(DType dtype, int32_t head_dim, int32_t n_heads,
                                int32_t n_kv_heads) {
  return attention_shapes_supported(dtype, n_heads, n_kv_heads) && head_dim >= 1 &&
         head_dim <= kAttentionGeneralMaxHeadDim;
}

Status launch_attention_general(const AttentionTensors<void>& tensors, int32_t n_work,
                                int32_t max_n_new, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, DType dtype, float scale, KernelStream stream) {
  LITELLAMA_RETURN_IF_ERROR(check_attention_launch(
      "attention_general", attention_general_supports(dtype, head_dim, n_heads, n_kv_heads), dtype,
      head_dim, n_heads, n_kv_heads, n_work, n_heads, "n_heads {}", n_heads));
  if (n_work == 0) return Status::ok();
  const Params p{tensors, n_heads, n_kv_heads, head_dim, scale};
  return dispatch_float_dtype(dtype, "attention_general", [&](auto type) {
    return dispatch_vpl<typename decltype(type)::type>(p, n_work, max_n_new, stream);
  });
}

}  // namespace litellama
