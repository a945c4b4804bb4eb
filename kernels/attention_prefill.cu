// Varlen causal prefill attention, FlashAttention-2 style, over the token-attention KV pool.
//
// Work split: one CTA per (query tile, sequence, KV head). The query rows of a sequence for one KV
// head are packed as (token, head-in-group) pairs, row r = token * group + g, so a K/V tile that
// is gathered once through the slot table serves every query head of the group (packed GQA). A
// CTA loops over its sequence's query tiles (grid-stride, latest positions first), so the grid
// size never limits correctness.
//
// bf16/fp16 (tensor cores): 4 warps x 16 rows = 64 rows per tile, 64 keys per K/V tile. Q stays in
// registers as mma A fragments; S = Q K^T and O += P V run as mma.sync m16n8k16 with fp32
// accumulators; the S accumulator is re-packed in registers as the A fragment of P. K/V rows are
// gathered with cp.async (16 bytes per thread, zero-filled past the sequence) into padded shared
// rows (+16 bytes, so ldmatrix is conflict-free); the next K tile loads while softmax and P V run,
// V loads while S runs. Online softmax in base 2 with the scale folded into one multiply; the row
// sum is reduced across the quad only once at the end.
//
// float32: exact fp32 SIMT kernel (16 rows x 32 keys per step, expf, no TF32) for verification.
#include "kernels/attention_prefill.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention_common.cuh"
#include "kernels/attention_general.h"
#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/mma_common.cuh"
#endif

namespace litellama {
#if !LITELLAMA_PORTABLE_KERNELS

namespace {

constexpr int kThreads = 128;  // 4 warps

template <typename T>
struct PrefillParams : AttentionTensors<T> {
  int n_heads;
  int n_kv_heads;
  int group;
  float scale;  // softmax scale (natural base)
};

// What one CTA of a prefill grid covers: the new tokens of sequence seq_ids[blockIdx.y] (the first
// is token tok0, at position pos0 of kv_len) against KV head kvh = blockIdx.z, as n_rows packed
// rows (token, query head of the group); slots is the sequence's slot table.
struct PrefillCta {
  int kvh, tok0, kv_len, pos0;
  const int32_t* slots;
  int group, n_rows;
};

template <typename T>
__device__ __forceinline__ PrefillCta prefill_cta(const PrefillParams<T>& p) {
  const int seq = p.seq_ids[blockIdx.y];
  PrefillCta c;
  c.kvh = blockIdx.z;
  c.tok0 = p.token_start[seq];
  const int n_new = p.token_start[seq + 1] - c.tok0;
  c.kv_len = p.kv_len[seq];
  c.pos0 = c.kv_len - n_new;
  c.slots = p.slot_table + p.slot_start[seq];
  c.group = p.group;
  c.n_rows = n_new * c.group;
  return c;
}

// ---- tensor-core kernel (bf16 / fp16) ----------------------------------------------------------

constexpr int kBlockM = 64;  // packed rows per tile (16 per warp)
constexpr int kBlockN = 64;  // keys per K/V tile

template <typename T, int D>
struct TcLayout {
  static constexpr int kStride = D + 8;  // shared row in elements: +16 bytes against bank conflicts
  static constexpr int kTileElems = kBlockM * kStride;
  static constexpr int kChunksPerRow = D * static_cast<int>(sizeof(T)) / 16;
  static constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  static constexpr int kChunksPerThread = kBlockN * kChunksPerRow / kThreads;
  static constexpr size_t kSmemBytes = 3 * kTileElems * sizeof(T);  // Q, K, V
  static_assert(kBlockM == kBlockN, "Q, K and V tiles share one shape");
  static_assert(kBlockN * kChunksPerRow % kThreads == 0, "whole chunks per thread");
};

// Gathers rows key0 .. key0+kBlockN-1 of one KV head into shared memory; rows at or past n_keys
// are zero-filled so that masked (zero-weight) columns never multiply garbage.
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(T* dst, const T* pool, const int32_t* slots, int key0,
                                             int n_keys, int n_kv_heads, int kvh) {
  using L = TcLayout<T, D>;
  for_each_tile_chunk<L, kThreads>([&](int, int row, int col) {
    const int pos = key0 + row;
    const bool valid = pos < n_keys;
    const T* src = pool;
    if (valid) src = pool + (static_cast<int64_t>(slots[pos]) * n_kv_heads + kvh) * D + col;
    cp_async_16(dst + row * L::kStride + col, src, valid);
  });
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_prefill_tc_kernel(const PrefillParams<T> p) {
  using L = TcLayout<T, D>;
  constexpr int kStride = L::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + L::kTileElems;
  T* s_v = s_k + L::kTileElems;

  const auto [kvh, tok0, kv_len, pos0, slots, group, n_rows] = prefill_cta(p);
  const int n_q_tiles = ceil_div(n_rows, kBlockM);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  for (int it = blockIdx.x; it < n_q_tiles; it += gridDim.x) {
    const int row0 = (n_q_tiles - 1 - it) * kBlockM;  // latest positions (most keys) first
    const int row_end = min(row0 + kBlockM, n_rows);
    const int min_pos = pos0 + row0 / group;
    const int max_pos = pos0 + (row_end - 1) / group;
    const int n_key_tiles = max_pos / kBlockN + 1;  // keys 0..max_pos

    __syncthreads();  // the previous tile's shared reads are done
    // The structured bindings are captured as copies: the kernels build as C++17, where a lambda
    // cannot capture a binding itself.
    for_each_tile_chunk<L, kThreads>(
        [&, tok0 = tok0, kvh = kvh, group = group, n_rows = n_rows](int, int r, int col) {
          const int row = row0 + r;
          const bool valid = row < n_rows;
          const T* src = p.q;
          if (valid) {
            const int64_t token = tok0 + row / group;
            const int head = kvh * group + row % group;
            src = p.q + (token * p.n_heads + head) * D + col;
          }
          cp_async_16(s_q + r * kStride + col, src, valid);
        });
    load_kv_tile<T, D>(s_k, p.k_pool, slots, 0, kv_len, p.n_kv_heads, kvh);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    uint32_t q_frag[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      ldmatrix_x4(q_frag[kk], s_q + (warp * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
    }
    // This thread's two rows (lane/4 and lane/4 + 8 of the warp's 16): their query positions.
    // Padding rows take the tile's last position, so they stay finite and are never stored.
    int q_pos[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + warp * 16 + lane / 4 + 8 * i;
      q_pos[i] = row < n_rows ? pos0 + row / group : max_pos;
    }
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

    for (int kt = 0; kt < n_key_tiles; ++kt) {
      const int key0 = kt * kBlockN;
      load_kv_tile<T, D>(s_v, p.v_pool, slots, key0, kv_len, p.n_kv_heads, kvh);
      cp_async_commit();
      cp_async_wait<1>();  // K tile kt has landed (V kt may still be in flight)
      __syncthreads();

      float s[kBlockN / 8][4];
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBlockN / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, s_k + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride + kk * 16 +
                             ((lane / 8) % 2) * 8);
          mma_16816<T>(s[2 * np], q_frag[kk], b[0], b[1]);
          mma_16816<T>(s[2 * np + 1], q_frag[kk], b[2], b[3]);
        }
      }
      __syncthreads();  // every warp is done with s_k
      if (kt + 1 < n_key_tiles) {
        load_kv_tile<T, D>(s_k, p.k_pool, slots, key0 + kBlockN, kv_len, p.n_kv_heads, kvh);
      }
      cp_async_commit();  // possibly empty: keeps the group count uniform

      const bool need_mask = key0 + kBlockN - 1 > min_pos;
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[nt][e] * scale_log2;
          const int key = key0 + nt * 8 + 2 * (lane % 4) + (e & 1);
          if (need_mask && key > q_pos[e / 2]) x = -INFINITY;
          s[nt][e] = x;
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
          mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
        mx = quad_max(mx);
        const float m_new = fmaxf(m[i], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
        const float corr = exp2f(m[i] - m_use);
        m[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) {
          s[nt][2 * i] = exp2f(s[nt][2 * i] - m_use);
          s[nt][2 * i + 1] = exp2f(s[nt][2 * i + 1] - m_use);
          sum += s[nt][2 * i] + s[nt][2 * i + 1];
        }
        l[i] = l[i] * corr + sum;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
          o[nt][2 * i] *= corr;
          o[nt][2 * i + 1] *= corr;
        }
      }

      cp_async_wait<1>();  // V tile kt has landed (K kt+1 may still be in flight)
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kBlockN / 16; ++j) {
        uint32_t a[4];
        a[0] = pack2<T>(s[2 * j][0], s[2 * j][1]);
        a[1] = pack2<T>(s[2 * j][2], s[2 * j][3]);
        a[2] = pack2<T>(s[2 * j + 1][0], s[2 * j + 1][1]);
        a[3] = pack2<T>(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, s_v + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                   dp * 16 + (lane / 16) * 8);
          mma_16816<T>(o[2 * dp], a, b[0], b[1]);
          mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();  // every warp is done with s_v
    }
    cp_async_wait<0>();  // nothing in flight into shared memory before it is reused

#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float sum = quad_sum(l[i]);
      const float inv = 1.0f / sum;
      const int row = row0 + warp * 16 + lane / 4 + 8 * i;
      if (row >= n_rows) continue;
      const int64_t token = tok0 + row / group;
      const int head = kvh * group + row % group;
      T* dst = p.out + (token * p.n_heads + head) * D + 2 * (lane % 4);
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        *reinterpret_cast<uint32_t*>(dst + nt * 8) =
            pack2<T>(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
      }
    }
  }
}

// ---- fp32 SIMT kernel --------------------------------------------------------------------------

constexpr int kF32Rows = 16;  // packed rows per tile (4 per warp for the scores)
constexpr int kF32Keys = 32;  // keys per step (one per lane for the scores)

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_f32_kernel(const PrefillParams<float> p) {
  constexpr int kAcc = kF32Rows * D / kThreads;  // (row, dim) outputs per thread
  __shared__ __align__(16) float s_q[kF32Rows][D];
  __shared__ float s_k[kF32Keys][D + 1];  // +1: lanes read different rows of one column
  __shared__ __align__(16) float s_v[kF32Keys][D];
  __shared__ float s_p[kF32Rows][kF32Keys];
  __shared__ float s_m[kF32Rows];
  __shared__ float s_l[kF32Rows];
  __shared__ float s_corr[kF32Rows];
  __shared__ int s_pos[kF32Rows];

  const auto [kvh, tok0, kv_len, pos0, slots, group, n_rows] = prefill_cta(p);
  const int n_q_tiles = ceil_div(n_rows, kF32Rows);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int it = blockIdx.x; it < n_q_tiles; it += gridDim.x) {
    const int row0 = (n_q_tiles - 1 - it) * kF32Rows;
    const int row_end = min(row0 + kF32Rows, n_rows);
    const int max_pos = pos0 + (row_end - 1) / group;
    const int n_key_steps = max_pos / kF32Keys + 1;

    __syncthreads();
    for (int c = threadIdx.x; c < kF32Rows * D / 4; c += kThreads) {
      const int r = c / (D / 4);
      const int col = (c % (D / 4)) * 4;
      const int row = row0 + r;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row < n_rows) {
        const int64_t token = tok0 + row / group;
        const int head = kvh * group + row % group;
        v = *reinterpret_cast<const float4*>(p.q + (token * p.n_heads + head) * D + col);
      }
      *reinterpret_cast<float4*>(&s_q[r][col]) = v;
    }
    if (threadIdx.x < kF32Rows) {
      const int row = row0 + threadIdx.x;
      s_pos[threadIdx.x] = row < n_rows ? pos0 + row / group : max_pos;
      s_m[threadIdx.x] = -INFINITY;
      s_l[threadIdx.x] = 0.0f;
    }
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

    for (int ks = 0; ks < n_key_steps; ++ks) {
      const int key0 = ks * kF32Keys;
      __syncthreads();  // previous step's reads of s_k, s_v, s_p are done
      load_kv_step_f32<D, kF32Keys, kThreads>(s_k, s_v, p.k_pool, p.v_pool, slots, key0, kv_len,
                                              p.n_kv_heads, kvh);
      __syncthreads();
      // Scores and the online-softmax update: warp w owns rows 4w..4w+3, lane = key.
#pragma unroll
      for (int rr = 0; rr < kF32Rows / 4; ++rr) {
        const int r = warp * (kF32Rows / 4) + rr;
        const int key = key0 + lane;
        const float x = key <= s_pos[r] ? score_f32<D>(s_q, s_k, r, lane) * p.scale : -INFINITY;
        // A row's first keys may all be in its future (masked): guard its max.
        online_softmax_step_f32<true>(x, lane, s_p[r], &s_corr[r], &s_m[r], &s_l[r]);
      }
      __syncthreads();
      accumulate_pv_f32<D, kThreads, kF32Keys>(acc, s_p, s_v, s_corr);
    }
    __syncthreads();  // s_l final
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int r = idx / D;
      const int d = idx % D;
      const int row = row0 + r;
      if (row >= n_rows) continue;
      const int64_t token = tok0 + row / group;
      const int head = kvh * group + row % group;
      p.out[(token * p.n_heads + head) * D + d] = acc[i] / s_l[r];
    }
  }
}

// ---- launch ------------------------------------------------------------------------------------

struct LaunchArgs {
  AttentionArgs attention;
  int32_t max_n_new;
};

template <typename T>
PrefillParams<T> make_params(const AttentionArgs& a) {
  return PrefillParams<T>{typed_tensors<T>(a.tensors), a.n_heads, a.n_kv_heads,
                          a.n_heads / a.n_kv_heads, a.scale};
}

template <typename T, int D>
Status launch_typed(const LaunchArgs& la) {
  const AttentionArgs& a = la.attention;
  const int group = a.n_heads / a.n_kv_heads;
  const int64_t rows = static_cast<int64_t>(std::max(la.max_n_new, 1)) * group;
  if constexpr (std::is_same_v<T, float>) {
    const int64_t tiles = ceil_div<int64_t>(rows, kF32Rows);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, 65535)), a.n_work, a.n_kv_heads);
    attention_prefill_f32_kernel<D><<<grid, kThreads, 0, a.stream.stream>>>(make_params<float>(a));
    LITELLAMA_CUDA_CHECK_LAUNCH("attention_prefill_f32_kernel");
  } else {
    using L = TcLayout<T, D>;
    const int64_t tiles = ceil_div<int64_t>(rows, kBlockM);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, 65535)), a.n_work, a.n_kv_heads);
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(attention_prefill_tc_kernel<T, D>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(L::kSmemBytes)));
    attention_prefill_tc_kernel<T, D>
        <<<grid, kThreads, L::kSmemBytes, a.stream.stream>>>(make_params<T>(a));
    LITELLAMA_CUDA_CHECK_LAUNCH("attention_prefill_tc_kernel");
  }
  return Status::ok();
}

Status dispatch(const LaunchArgs& a, DType dtype, int32_t head_dim) {
  return dispatch_float_dtype(dtype, "attention_prefill", [&](auto type) {
    using T = typename decltype(type)::type;
    return dispatch_tuned_head_dim(head_dim, "attention_prefill",
                                   [&](auto d) { return launch_typed<T, decltype(d)::value>(a); });
  });
}

}  // namespace

#endif  // !LITELLAMA_PORTABLE_KERNELS

bool attention_prefill_supports(DType dtype, int32_t head_dim, int32_t n_heads,
                                int32_t n_kv_heads) {
  return attention_shapes_supported(dtype, n_heads, n_kv_heads) &&
         (attention_prefill_tuned(head_dim) ||
          attention_general_supports(dtype, head_dim, n_heads, n_kv_heads));
}

// Portable builds (kernels/gpu_runtime.h) compile none of the tuned kernels above (tensor cores
// through inline PTX): every head size takes the general path there.
bool attention_prefill_tuned(int32_t head_dim) {
  return !LITELLAMA_PORTABLE_KERNELS && (head_dim == 64 || head_dim == 128);
}

Status launch_attention_prefill(const AttentionTensors<void>& tensors, int32_t n_work,
                                int32_t max_n_new, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, DType dtype, float scale, KernelStream stream) {
  LITELLAMA_RETURN_IF_ERROR(check_attention_launch(
      "attention_prefill", attention_prefill_supports(dtype, head_dim, n_heads, n_kv_heads), dtype,
      head_dim, n_heads, n_kv_heads, n_work, n_kv_heads, "n_kv_heads {}", n_kv_heads));
  if (n_work == 0) return Status::ok();
  if (!attention_prefill_tuned(head_dim)) {
    return launch_attention_general(tensors, n_work, max_n_new, n_heads, n_kv_heads, head_dim,
                                    dtype, scale, stream);
  }
#if LITELLAMA_PORTABLE_KERNELS
  return make_error(StatusCode::kInternal, "attention_prefill: no tuned kernel in this build");
#else
  const LaunchArgs args{{tensors, n_work, n_heads, n_kv_heads, scale, stream}, max_n_new};
  return dispatch(args, dtype, head_dim);
#endif
}

}  // namespace litellama
