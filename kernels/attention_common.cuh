// What the three attention kernels over the token-attention KV pool (attention_decode.cu,
// attention_prefill.cu, attention_general.cu) share: the batch description their launchers take,
// its typed form that heads each kernel's parameter struct, and the shape check of their supports()
// predicates. Included by .cu files only.
#pragma once

#include <cstdint>
#include <utility>

#include <fmt/format.h>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/attention_tensors.h"
#include "kernels/kernel_common.cuh"
#include "kernels/kernel_stream.h"

namespace litellama {

// A launcher's arguments as one value, passed from the public launcher to the typed launch.
struct AttentionArgs {
  AttentionTensors<void> tensors;
  int32_t n_work;
  int32_t n_heads;
  int32_t n_kv_heads;
  float scale;  // softmax scale (natural base)
  KernelStream stream;
};

template <typename T>
AttentionTensors<T> typed_tensors(const AttentionTensors<void>& t) {
  return AttentionTensors<T>{static_cast<T*>(t.out),
                             static_cast<const T*>(t.q),
                             static_cast<const T*>(t.k_pool),
                             static_cast<const T*>(t.v_pool),
                             t.token_start,
                             t.kv_len,
                             t.slot_start,
                             t.slot_table,
                             t.seq_ids};
}

// The float32 kernels' K/V step (prefill and decode alike): keys key0 .. key0 + kKeys - 1 of KV
// head kvh, gathered through the sequence's slots by the kThreads threads of the CTA, 16 bytes a
// thread at a time. K goes into rows padded by one float (the score loop's lanes read one column
// of different rows); keys at or past key_end are zero in both.
template <int D, int kKeys, int kThreads>
__device__ __forceinline__ void load_kv_step_f32(float (*s_k)[D + 1], float (*s_v)[D],
                                                 const float* k_pool, const float* v_pool,
                                                 const int32_t* slots, int key0, int key_end,
                                                 int n_kv_heads, int kvh) {
  for (int c = threadIdx.x; c < kKeys * D / 4; c += kThreads) {
    const int r = c / (D / 4);
    const int col = (c % (D / 4)) * 4;
    const int pos = key0 + r;
    float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 vv = kv;
    if (pos < key_end) {
      const int64_t off = (static_cast<int64_t>(slots[pos]) * n_kv_heads + kvh) * D + col;
      kv = *reinterpret_cast<const float4*>(k_pool + off);
      vv = *reinterpret_cast<const float4*>(v_pool + off);
    }
    s_k[r][col] = kv.x;
    s_k[r][col + 1] = kv.y;
    s_k[r][col + 2] = kv.z;
    s_k[r][col + 3] = kv.w;
    *reinterpret_cast<float4*>(&s_v[r][col]) = vv;
  }
}

// The tensor-core kernels' tile copies: calls f(i, row, col) for each 16-byte chunk of a tile that
// this thread of the CTA's kThreads copies (its i-th chunk, at tile row `row` from column `col`).
// L is the kernel's tile layout (kChunksPerThread, kChunksPerRow, kElemsPerChunk).
template <typename L, int kThreads, typename F>
__device__ __forceinline__ void for_each_tile_chunk(F&& f) {
#pragma unroll
  for (int i = 0; i < L::kChunksPerThread; ++i) {
    const int c = threadIdx.x + i * kThreads;
    f(i, c / L::kChunksPerRow, (c % L::kChunksPerRow) * L::kElemsPerChunk);
  }
}

// The float32 kernels' score of query row r against key `lane` of the step: q[r] . k[lane].
template <int D>
__device__ __forceinline__ float score_f32(const float (*s_q)[D], const float (*s_k)[D + 1], int r,
                                           int lane) {
  float dot = 0.0f;
#pragma unroll 16
  for (int d = 0; d < D; ++d) dot = fmaf(s_q[r][d], s_k[lane][d], dot);
  return dot;
}

// The float32 kernels' online-softmax update of one query row over a step of 32 keys (the
// warp's lanes, lane = key; x is the lane's scaled score, -inf for a masked key): the step's
// exp(x - m) go to p_row, and lane 0 stores the factor exp(m_old - m) that rescales the row's
// accumulators in *corr, the row's new running max in *m and its rescaled sum plus the step's in
// *l. With kRowMayBeEmpty, a row whose keys so far are all masked (max still -inf) uses 0 in
// place of the max, so that its exp stay 0 instead of NaN.
template <bool kRowMayBeEmpty>
__device__ __forceinline__ void online_softmax_step_f32(float x, int lane, float* p_row,
                                                        float* corr, float* m, float* l) {
  const float mx = warp_max(x);
  const float m_old = *m;
  const float m_new = fmaxf(m_old, mx);
  const float m_use = kRowMayBeEmpty && m_new == -INFINITY ? 0.0f : m_new;
  const float e = expf(x - m_use);
  const float sum = warp_sum(e);
  p_row[lane] = e;
  gpu_syncwarp();
  if (lane == 0) {
    const float c = expf(m_old - m_use);
    *corr = c;
    *m = m_new;
    *l = *l * c + sum;
  }
}

// The float32 kernels' P.V step: each of the CTA's kThreads threads holds kAcc (row, dim)
// accumulators (element threadIdx.x + i * kThreads of the [rows, D] output tile), rescales each
// by its row's correction and adds the step's probabilities times V.
template <int D, int kThreads, int kKeys, int kAcc>
__device__ __forceinline__ void accumulate_pv_f32(float (&acc)[kAcc], const float (*s_p)[kKeys],
                                                  const float (*s_v)[D], const float* s_corr) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / D;
    const int d = idx % D;
    float a = acc[i] * s_corr[r];
#pragma unroll 8
    for (int n = 0; n < kKeys; ++n) a = fmaf(s_p[r][n], s_v[n][d], a);
    acc[i] = a;
  }
}

// What every attention launcher checks before it launches: a supported shape (else kUnsupported)
// and n_work and the grid's other large dimension within CUDA's 65535 (else kInvalidArgument,
// naming that dimension as `dims` formats it; formatted only on that error). Messages start with
// the launcher's name `op`.
template <typename... DimArgs>
Status check_attention_launch(const char* op, bool supported, DType dtype, int32_t head_dim,
                              int32_t n_heads, int32_t n_kv_heads, int32_t n_work, int64_t grid_dim,
                              const char* dims, const DimArgs&... dim_args) {
  if (!supported) {
    return make_error(StatusCode::kUnsupported,
                      "{}: unsupported dtype {}, head_dim {} or heads {}/{}", op,
                      dtype_torch_name(dtype), head_dim, n_heads, n_kv_heads);
  }
  if (n_work < 0 || n_work > 65535 || grid_dim > 65535) {
    return make_error(StatusCode::kInvalidArgument, "{}: n_work {} or {} out of range", op, n_work,
                      fmt::format(fmt::runtime(dims), dim_args...));
  }
  return Status::ok();
}

// The dtype and head-count half of every attention supports() predicate: a float compute dtype
// and n_heads a positive multiple of n_kv_heads (whole query groups per KV head).
inline bool attention_shapes_supported(DType dtype, int32_t n_heads, int32_t n_kv_heads) {
  return is_float_compute_dtype(dtype) && n_kv_heads > 0 && n_heads > 0 &&
         n_heads % n_kv_heads == 0;
}

}  // namespace litellama
