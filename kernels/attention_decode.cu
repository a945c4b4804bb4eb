// Split-K decode attention (FlashDecoding) over the token-attention KV pool.
//
// Grid: (split, sequence, KV head x head block). A CTA takes one contiguous key range of one
// sequence for one KV head and computes up to 16 query heads of that KV head's group at once, so
// the group shares every K/V byte read. The key range of split i is [i*chunk, (i+1)*chunk) with
// chunk = ceil(kv_len / n_splits) rounded up to whole tiles, computed on the device from the
// sequence's own kv_len: short sequences use fewer splits of the same grid and the result never
// depends on the host's max_kv_len hint. With n_splits == 1 the CTA writes the output directly.
// Split results are (normalized partial output, base-2 log-sum-exp) per (head, dimension), merged
// with weights 2^(lse_i - max lse):
//   - bf16/fp16 with 2 to kMaxClusterSplits splits on compute capability 9.0+: the splits of one
//     (sequence, KV head, head block) form one thread-block cluster. Each CTA leaves its result in
//     its own shared memory, the cluster synchronizes, and every CTA merges a share of the
//     (head, dimension) outputs by reading all of the cluster's results through distributed
//     shared memory: one kernel, no workspace, no global round trip, and no separate merge
//     launch per layer;
//   - otherwise the CTAs write their results to the workspace and attention_decode_merge_kernel
//     combines them.
//
// bf16/fp16: 4 warps, tiles of 64 keys gathered through the slot table with cp.async (16 bytes per
// thread, 2 tiles in flight ahead of the one being consumed), each warp takes 16 keys of a tile:
// S = Q K^T and O += P V as mma.sync m16n8k16 with the group's heads as the 16 rows (zero rows
// past the group), fp32 accumulators and a base-2 online softmax per warp; the 4 warps' states
// merge through shared memory at the end.
// float32: exact fp32 SIMT path (32 keys per step, expf, no TF32).
#include "kernels/attention_decode.h"

#if !LITELLAMA_PORTABLE_KERNELS
#include <cooperative_groups.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention_common.cuh"
#include "kernels/attention_general.h"
#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/mma_common.cuh"
#endif

namespace litellama {
#if !LITELLAMA_PORTABLE_KERNELS

namespace {

constexpr int kThreads = 128;     // 4 warps
constexpr int kHeadsPerCta = 16;  // query heads of one group per CTA (the mma M dimension)
constexpr int kBlockN = 64;       // keys per tile (16 per warp on the tensor-core path)
constexpr int kStages = 3;        // tensor-core path: tiles resident in shared memory
constexpr int kF32Keys = 32;      // fp32 path: keys per step (one per lane for the scores)
// Split plan. Under one wave of CTAs, split for parallelism: about kCtasPerSmTarget CTAs per
// multiprocessor, no split under kMinKeysPerSplit keys. From one wave up, split only against wave
// quantization (a last, partly filled wave), into splits of at least kMinKeysPerWaveSplit keys.
constexpr int kMinKeysPerSplit = 64;
constexpr int kMaxSplits = 64;
constexpr int kMaxClusterSplits = 8;  // the portable cluster size
constexpr int kCtasPerSmTarget = 2;
constexpr int kMinKeysPerWaveSplit = 1024;
constexpr int kMaxWaveSplits = 4;
constexpr int kSmemPerSmBytes = 228 * 1024;  // sm_90 (sm_80: 164 KB; only the plan is off)
constexpr int kSmemPerCtaReservedBytes = 1024;

// Keys per split for a sequence of kv_len keys: whole tiles, so every split but the last is full.
// The merge kernel recomputes it to know how many splits hold data (ceil(kv_len / chunk)).
__host__ __device__ __forceinline__ int split_chunk(int kv_len, int n_splits) {
  return round_up(ceil_div(kv_len, n_splits), kBlockN);
}

template <typename T>
struct DecodeParams : AttentionTensors<T> {
  float* part_o;    // [n_work, n_splits, n_heads, head_dim] (n_splits > 1)
  float* part_lse;  // [n_work, n_splits, n_heads] base-2 log-sum-exp of scaled scores
  int n_heads;
  int n_kv_heads;
  int group;
  int n_head_blocks;
  float scale;
};

// What one CTA of a decode grid (split, work item, block of query heads) covers: query heads
// head0 .. head0 + n_rows - 1 of KV head kvh for sequence seq, whose query is token `token`, and
// its keys key_begin .. key_end - 1 (none when the sequence is shorter than the splits).
struct DecodeCta {
  int split, work, kvh, head0, n_rows, seq;
  int64_t token;
  int kv_len, key_begin, key_end;
};

template <typename T>
__device__ __forceinline__ DecodeCta decode_cta(const DecodeParams<T>& p) {
  DecodeCta c;
  c.split = blockIdx.x;
  c.work = blockIdx.y;
  c.kvh = blockIdx.z / p.n_head_blocks;
  c.head0 = c.kvh * p.group + (blockIdx.z % p.n_head_blocks) * kHeadsPerCta;
  c.n_rows = min(kHeadsPerCta, c.kvh * p.group + p.group - c.head0);
  c.seq = p.seq_ids[c.work];
  c.token = p.token_start[c.seq];
  c.kv_len = p.kv_len[c.seq];
  const int chunk = split_chunk(c.kv_len, gridDim.x);
  c.key_begin = c.split * chunk;
  c.key_end = min(c.kv_len, c.key_begin + chunk);
  return c;
}

// Where a CTA's result goes: directly to out (one split) or to the workspace.
template <typename T, int D>
__device__ __forceinline__ void store_result(const DecodeParams<T>& p, int work, int split,
                                             int head, int64_t token, int d, float o_sum,
                                             float l_sum, float m_log2) {
  if (gridDim.x == 1) {
    p.out[(token * p.n_heads + head) * D + d] = from_float<T>(o_sum / l_sum);
    return;
  }
  const int64_t row = (static_cast<int64_t>(work) * gridDim.x + split) * p.n_heads + head;
  p.part_o[row * D + d] = o_sum / l_sum;
  if (d == 0) p.part_lse[row] = m_log2 + log2f(l_sum);
}

// ---- tensor-core kernel (bf16 / fp16) ----------------------------------------------------------

template <typename T, int D>
struct TcLayout {
  static constexpr int kStride = D + 8;  // shared row in elements: +16 bytes against bank conflicts
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr int kChunksPerRow = D * static_cast<int>(sizeof(T)) / 16;
  static constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  static constexpr int kChunksPerThread = kBlockN * kChunksPerRow / kThreads;
  static constexpr int kMergeStride = D + 4;                         // floats
  static constexpr size_t kStageBytes = 2 * kTileElems * sizeof(T);  // K and V
  static constexpr size_t kMergeBytes =
      (4 * kHeadsPerCta * kMergeStride + 2 * 4 * kHeadsPerCta) * sizeof(float);
  // Cluster merge: the CTA's split result after the warp merge area, [kHeadsPerCta][D] partial
  // outputs then [kHeadsPerCta] log-sum-exps.
  static constexpr size_t kResultBytes = (kHeadsPerCta * D + kHeadsPerCta) * sizeof(float);
  static constexpr size_t kSmemBytes = std::max(kStages * kStageBytes, kMergeBytes + kResultBytes);
  static_assert(kBlockN * kChunksPerRow % kThreads == 0, "whole chunks per thread");
};

// The slot of each row this thread copies in a tile of keys key0 .. key0+kBlockN-1 (0 past
// key_end). All lookups are issued before any copy, so that they overlap: with each lookup next
// to its copies, each copy's address would wait for its lookup and the lookups would run one
// after another (8 dependent round trips per tile at head_dim 128).
template <typename T, int D>
__device__ __forceinline__ void lookup_kv_slots(int32_t (&slot)[TcLayout<T, D>::kChunksPerThread],
                                                const int32_t* slots, int key0, int key_end) {
  using L = TcLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kChunksPerThread; ++i) {
    const int pos = key0 + (threadIdx.x + i * kThreads) / L::kChunksPerRow;
    slot[i] = pos < key_end ? __ldg(slots + pos) : 0;
  }
}

// Gathers K and V rows key0 .. key0+kBlockN-1 from the slots lookup_kv_slots found; rows at or
// past key_end are zero-filled and never read from memory. With kSkip the row of key `skip` (when
// in the tile) is left alone: load_kv_row fills it later.
template <typename T, int D, bool kSkip = false>
__device__ __forceinline__ void copy_kv_stage(
    T* s_k, T* s_v, const DecodeParams<T>& p,
    const int32_t (&slot)[TcLayout<T, D>::kChunksPerThread], int key0, int key_end, int kvh,
    int skip = -1) {
  using L = TcLayout<T, D>;
  for_each_tile_chunk<L, kThreads>([&](int i, int row, int col) {
    const int pos = key0 + row;
    if constexpr (kSkip) {
      if (pos == skip) return;
    }
    const int64_t off = (static_cast<int64_t>(slot[i]) * p.n_kv_heads + kvh) * D + col;
    cp_async_16(s_k + row * L::kStride + col, p.k_pool + off, pos < key_end);
    cp_async_16(s_v + row * L::kStride + col, p.v_pool + off, pos < key_end);
  });
}

template <typename T, int D>
__device__ __forceinline__ void load_kv_stage(T* s_k, T* s_v, const DecodeParams<T>& p,
                                              const int32_t* slots, int key0, int key_end,
                                              int kvh) {
  int32_t slot[TcLayout<T, D>::kChunksPerThread];
  lookup_kv_slots<T, D>(slot, slots, key0, key_end);
  copy_kv_stage<T, D>(s_k, s_v, p, slot, key0, key_end, kvh);
}

// Copies the K and V row of key `pos` (row pos - key0 of the tile) with plain loads and stores, by
// the threads that load_kv_stage gives that row; visible to the block after its next barrier.
template <typename T, int D>
__device__ __forceinline__ void load_kv_row(T* s_k, T* s_v, const DecodeParams<T>& p,
                                            const int32_t* slots, int key0, int pos, int kvh) {
  using L = TcLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kChunksPerThread; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int row = c / L::kChunksPerRow;
    if (key0 + row != pos) continue;
    const int col = (c % L::kChunksPerRow) * L::kElemsPerChunk;
    const int64_t off = (static_cast<int64_t>(slots[pos]) * p.n_kv_heads + kvh) * D + col;
    *reinterpret_cast<uint4*>(s_k + row * L::kStride + col) =
        *reinterpret_cast<const uint4*>(p.k_pool + off);
    *reinterpret_cast<uint4*>(s_v + row * L::kStride + col) =
        *reinterpret_cast<const uint4*>(p.v_pool + off);
  }
}

// The cluster's merge (see the top of this file): CTA `rank` of the n_splits in the cluster
// writes output elements rank * kThreads + threadIdx.x, stepping by n_splits * kThreads, from the
// results every CTA left in its shared memory (s_res: partial outputs, then log-sum-exps).
template <typename T, int D>
__device__ __forceinline__ void cluster_merge(const DecodeParams<T>& p, float* s_res, int n_rows,
                                              int head0, int64_t token) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's result is in its shared memory
  const int n = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const float* s_lse = s_res + kHeadsPerCta * D;
  for (int idx = rank * kThreads + threadIdx.x; idx < n_rows * D; idx += n * kThreads) {
    const int r = idx / D;
    const int d = idx % D;
    float lse[kMaxClusterSplits];
    float o[kMaxClusterSplits];
    float lse_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxClusterSplits; ++i) {
      if (i < n) {
        lse[i] = *cluster.map_shared_rank(s_lse + r, i);
        o[i] = *cluster.map_shared_rank(s_res + r * D + d, i);
        lse_max = fmaxf(lse_max, lse[i]);
      }
    }
    float w_sum = 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxClusterSplits; ++i) {
      if (i < n && lse[i] != -INFINITY) {
        const float w = exp2f(lse[i] - lse_max);
        w_sum += w;
        acc += w * o[i];
      }
    }
    p.out[(token * p.n_heads + head0 + r) * D + d] = from_float<T>(acc / w_sum);
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
#else
  __trap();  // launched only on compute capability 9.0+
#endif
}

template <typename T, int D, bool kCluster, bool kEarly>
__global__ void __launch_bounds__(kThreads) attention_decode_tc_kernel(const DecodeParams<T> p) {
  LITELLAMA_TRACE_START();
  pdl_launch_dependents();  // the o projection may start loading its weights
  if constexpr (!kEarly) {
    pdl_wait();
    LITELLAMA_TRACE_RELEASED();
  }
  using L = TcLayout<T, D>;
  constexpr int kStride = L::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_stage = reinterpret_cast<T*>(smem_raw);

  const auto [split, work, kvh, head0, n_rows, seq, token, kv_len, key_begin, key_end] =
      decode_cta(p);
  // A sequence shorter than the grid's splits leaves the last ones empty: the merge kernel skips
  // them; in a cluster they still take part in the merge, with no keys (log-sum-exp -inf).
  if (!kCluster && key_begin >= kv_len) {
    pdl_wait();  // launch.h: no block leaves before the previous grid is complete
    return;
  }
  const int n_tiles = max(0, ceil_div(key_end - key_begin, kBlockN));
  const int32_t* slots = p.slot_table + p.slot_start[seq];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // With kEarly the first tiles start loading before the wait for the previous kernel (launch.h's
  // rule, with the exception attention_decode.h states): the step metadata comes from a copy that
  // precedes every kernel of the step, and keys before the newest were written in earlier steps.
  // The newest key's K and V (which the step's QKV kernel is writing) are copied after the wait.
  const int newest = kv_len - 1;
  {
    // The first stages' lookups all before their copies: one round trip for all of them.
    int32_t first_slots[kStages - 1][L::kChunksPerThread];
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < n_tiles) {
        lookup_kv_slots<T, D>(first_slots[st], slots, key_begin + st * kBlockN, key_end);
      }
    }
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < n_tiles) {
        T* s_k = s_stage + st * 2 * L::kTileElems;
        copy_kv_stage<T, D, kEarly>(s_k, s_k + L::kTileElems, p, first_slots[st],
                                    key_begin + st * kBlockN, key_end, kvh, newest);
      }
      cp_async_commit();
    }
  }
  if constexpr (kEarly) {
    pdl_wait();
    LITELLAMA_TRACE_RELEASED();
    const int newest_tile = (newest - key_begin) / kBlockN;
    if (newest >= key_begin && newest < key_end && newest_tile < kStages - 1) {
      T* s_k = s_stage + newest_tile * 2 * L::kTileElems;
      load_kv_row<T, D>(s_k, s_k + L::kTileElems, p, slots, key_begin + newest_tile * kBlockN,
                        newest, kvh);
    }
  }
  // Q straight from global memory into mma A fragments (rows past the group are zero) while the
  // first tiles are in flight: a thread holds rows lane/4 and lane/4 + 8, columns 2*(lane%4) + {0,
  // 1} and + 8 of each 16-column step.
  uint32_t q_frag[D / 16][4];
  {
    const T* q_head0 = p.q + (token * p.n_heads + head0) * D + 2 * (lane % 4);
    const int r0 = lane / 4;
    const int r1 = r0 + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const T* q0 = q_head0 + r0 * D + kk * 16;
      const T* q1 = q_head0 + r1 * D + kk * 16;
      q_frag[kk][0] = r0 < n_rows ? *reinterpret_cast<const uint32_t*>(q0) : 0u;
      q_frag[kk][1] = r1 < n_rows ? *reinterpret_cast<const uint32_t*>(q1) : 0u;
      q_frag[kk][2] = r0 < n_rows ? *reinterpret_cast<const uint32_t*>(q0 + 8) : 0u;
      q_frag[kk][3] = r1 < n_rows ? *reinterpret_cast<const uint32_t*>(q1 + 8) : 0u;
    }
  }

  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<kStages - 2>();  // tile t has landed
    __syncthreads();               // ... for every thread, and stage (t-1) % kStages is free
    {
      const int next = t + kStages - 1;
      if (next < n_tiles) {
        T* s_k = s_stage + (next % kStages) * 2 * L::kTileElems;
        load_kv_stage<T, D>(s_k, s_k + L::kTileElems, p, slots, key_begin + next * kBlockN, key_end,
                            kvh);
      }
      cp_async_commit();
    }
    const T* s_k = s_stage + (t % kStages) * 2 * L::kTileElems + warp * 16 * kStride;
    const T* s_v = s_k + L::kTileElems;
    const int key0 = key_begin + t * kBlockN + warp * 16;

    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, s_k + (lane % 8 + (lane / 16) * 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
      mma_16816<T>(s[0], q_frag[kk], b[0], b[1]);
      mma_16816<T>(s[1], q_frag[kk], b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * (lane % 4) + (e & 1);
        s[nt][e] = key < key_end ? s[nt][e] * scale_log2 : -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key for this warp yet
      const float corr = exp2f(m[i] - m_use);
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
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
    uint32_t a[4];
    a[0] = pack2<T>(s[0][0], s[0][1]);
    a[1] = pack2<T>(s[0][2], s[0][3]);
    a[2] = pack2<T>(s[1][0], s[1][1]);
    a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(
          b, s_v + (lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 + (lane / 16) * 8);
      mma_16816<T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: they become the merge area

  // Merge the 4 warps' (m, l, o) of each row through shared memory.
  float* s_o = reinterpret_cast<float*>(s_stage);         // [4][kHeadsPerCta][kMergeStride]
  float* s_m = s_o + 4 * kHeadsPerCta * L::kMergeStride;  // [4][kHeadsPerCta]
  float* s_l = s_m + 4 * kHeadsPerCta;                    // [4][kHeadsPerCta]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lane / 4 + 8 * i;
    const float sum = quad_sum(l[i]);
    float* dst = s_o + (warp * kHeadsPerCta + r) * L::kMergeStride + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
    }
    if (lane % 4 == 0) {
      s_m[warp * kHeadsPerCta + r] = m[i];
      s_l[warp * kHeadsPerCta + r] = sum;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n_rows * D; idx += kThreads) {
    const int r = idx / D;
    const int d = idx % D;
    float m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) m_max = fmaxf(m_max, s_m[w * kHeadsPerCta + r]);
    float l_sum = 0.0f;
    float o_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float mw = s_m[w * kHeadsPerCta + r];
      const float f = mw == -INFINITY ? 0.0f : exp2f(mw - m_max);
      l_sum += s_l[w * kHeadsPerCta + r] * f;
      o_sum += s_o[(w * kHeadsPerCta + r) * L::kMergeStride + d] * f;
    }
    if constexpr (kCluster) {
      float* s_res = s_o + L::kMergeBytes / sizeof(float);
      s_res[r * D + d] = l_sum > 0.0f ? o_sum / l_sum : 0.0f;
      if (d == 0) s_res[kHeadsPerCta * D + r] = l_sum > 0.0f ? m_max + log2f(l_sum) : -INFINITY;
    } else {
      store_result<T, D>(p, work, split, head0 + r, token, d, o_sum, l_sum, m_max);
    }
  }
  if constexpr (kCluster) {
    cluster_merge<T, D>(p, s_o + L::kMergeBytes / sizeof(float), n_rows, head0, token);
  }
  LITELLAMA_TRACE_END(BlockTraceKernel::kAttention, kCluster ? 1 : 0);
}

// ---- fp32 SIMT kernel --------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_decode_f32_kernel(const DecodeParams<float> p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kAcc = kHeadsPerCta * D / kThreads;  // (head, dim) outputs per thread
  __shared__ __align__(16) float s_q[kHeadsPerCta][D];
  __shared__ float s_k[kF32Keys][D + 1];  // +1: lanes read different rows of one column
  __shared__ __align__(16) float s_v[kF32Keys][D];
  __shared__ float s_p[kHeadsPerCta][kF32Keys];
  __shared__ float s_m[kHeadsPerCta];
  __shared__ float s_l[kHeadsPerCta];
  __shared__ float s_corr[kHeadsPerCta];

  const auto [split, work, kvh, head0, n_rows, seq, token, kv_len, key_begin, key_end] =
      decode_cta(p);
  if (key_begin >= kv_len) return;
  const int32_t* slots = p.slot_table + p.slot_start[seq];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int c = threadIdx.x; c < kHeadsPerCta * D / 4; c += kThreads) {
    const int r = c / (D / 4);
    const int col = (c % (D / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows)
      v = *reinterpret_cast<const float4*>(p.q + (token * p.n_heads + head0 + r) * D + col);
    *reinterpret_cast<float4*>(&s_q[r][col]) = v;
  }
  if (threadIdx.x < kHeadsPerCta) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
  }
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int key0 = key_begin; key0 < key_end; key0 += kF32Keys) {
    __syncthreads();  // previous step's reads of s_k, s_v, s_p are done
    load_kv_step_f32<D, kF32Keys, kThreads>(s_k, s_v, p.k_pool, p.v_pool, slots, key0, key_end,
                                            p.n_kv_heads, kvh);
    __syncthreads();
    // Scores and the online-softmax update: warp w owns heads 4w..4w+3, lane = key.
#pragma unroll
    for (int rr = 0; rr < kHeadsPerCta / 4; ++rr) {
      const int r = warp * (kHeadsPerCta / 4) + rr;
      const float x = key0 + lane < key_end ? score_f32<D>(s_q, s_k, r, lane) * p.scale : -INFINITY;
      // Every row has a key in every step (key0 < key_end): its max is finite.
      online_softmax_step_f32<false>(x, lane, s_p[r], &s_corr[r], &s_m[r], &s_l[r]);
    }
    __syncthreads();
    accumulate_pv_f32<D, kThreads, kF32Keys>(acc, s_p, s_v, s_corr);
  }
  __syncthreads();  // s_m, s_l final
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / D;
    const int d = idx % D;
    if (r >= n_rows) continue;
    // The merge works in base 2: m (natural-base max of scaled scores) times log2(e).
    store_result<float, D>(p, work, split, head0 + r, token, d, acc[i], s_l[r], s_m[r] * kLog2e);
  }
}

// ---- split merge
// ---------------------------------------------------------------------------------

// One thread per 4 dimensions of one (sequence, head): out = sum_i w_i o_i / sum_i w_i with
// w_i = 2^(lse_i - max lse) over the splits that hold keys.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_decode_merge_kernel(const DecodeParams<T> p, int n_work, int n_splits) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int kThreadsPerHead = D / 4;
  const int64_t gh = static_cast<int64_t>(blockIdx.x) * (kThreads / kThreadsPerHead) +
                     threadIdx.x / kThreadsPerHead;
  if (gh >= static_cast<int64_t>(n_work) * p.n_heads) return;
  const int work = static_cast<int>(gh / p.n_heads);
  const int head = static_cast<int>(gh % p.n_heads);
  const int d = (threadIdx.x % kThreadsPerHead) * 4;
  const int seq = p.seq_ids[work];
  const int kv_len = p.kv_len[seq];
  const int chunk = split_chunk(kv_len, n_splits);
  const int n_used = ceil_div(kv_len, chunk);
  const int64_t row0 = static_cast<int64_t>(work) * n_splits * p.n_heads + head;
  float m_max = -INFINITY;
  for (int s = 0; s < n_used; ++s) m_max = fmaxf(m_max, p.part_lse[row0 + s * p.n_heads]);
  float w_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < n_used; ++s) {
    const int64_t row = row0 + s * p.n_heads;
    const float w = exp2f(p.part_lse[row] - m_max);
    const float4 v = *reinterpret_cast<const float4*>(p.part_o + row * D + d);
    w_sum += w;
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  const float inv = 1.0f / w_sum;
  T* dst = p.out + (static_cast<int64_t>(p.token_start[seq]) * p.n_heads + head) * D + d;
  dst[0] = from_float<T>(acc.x * inv);
  dst[1] = from_float<T>(acc.y * inv);
  dst[2] = from_float<T>(acc.z * inv);
  dst[3] = from_float<T>(acc.w * inv);
}

// ---- launch ------------------------------------------------------------------------------------

int32_t n_head_blocks(int32_t n_heads, int32_t n_kv_heads) {
  const int32_t group = n_heads / n_kv_heads;
  return ceil_div<int32_t>(group, kHeadsPerCta);
}

size_t workspace_bytes_for(int32_t n_work, int32_t n_heads, int32_t head_dim, int32_t n_splits) {
  if (n_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(n_work) * n_splits * n_heads;
  return rows * (static_cast<size_t>(head_dim) + 1) * sizeof(float);
}

// Whether the cluster kernel runs as compiled for compute capability 9.0+: a build without sm_90
// code would run it from compute_80 PTX, where its body is a trap. Read once per process (from
// the device current at the first call).
bool cluster_kernel_available() {
  static const bool available = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, attention_decode_tc_kernel<gpu_bf16, 64, true, false>) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.ptxVersion >= 90;
  }();
  return available;
}

// Whether the splits merge inside one clustered launch (tensor-core path) rather than through
// the workspace and the merge kernel.
bool cluster_merges(int32_t n_splits, size_t elem_bytes) {
  return elem_bytes == 2 && n_splits >= 2 && n_splits <= kMaxClusterSplits &&
         current_device_supports_clusters() && cluster_kernel_available();
}

// Whether the tensor-core kernel loads its first K/V tiles before waiting for the previous kernel
// (the kEarly instantiation): at up to kEarlyKvMaxWork sequences the early loads overlap the QKV
// projection, larger batches keep the plain kernel. The two orders are two instantiations, not a
// runtime switch: a switch (and the skip test it puts in every tile load) slows the large batches
// whichever path runs.
constexpr int32_t kEarlyKvMaxWork = 8;
bool early_kv_loads(int32_t n_work) {
  return n_work <= kEarlyKvMaxWork;
}

// Shared memory the tensor-core kernel asks each multiprocessor for, in percent of the most
// (launch.h's LaunchShape); the rest is L1. The blocks that follow attention onto its
// multiprocessors without a pause (the o projection's GEMV, launched early) inherit attention's
// split, and the GEMVs need a large L1 for their loads in flight. The most shared memory fits two
// 128-wide CTAs and leaves 28 KB of L1. A single sequence with 128-wide heads asks for one CTA's
// worth (the 132 KB split): its CTAs spread one per multiprocessor and leave 124 KB of L1 beside
// them for the o projection. More sequences, and 64-wide heads, keep the most shared memory:
// there attention's own occupancy matters more than the L1 left to the next kernel
// (bench/RESULTS.md has the measurements).
int tc_carveout_percent(int32_t head_dim, int32_t n_work) {
  if (head_dim != 128 || n_work != 1) return cudaSharedmemCarveoutMaxShared;
  const int bytes =
      static_cast<int>(TcLayout<gpu_bf16, 128>::kSmemBytes) + kSmemPerCtaReservedBytes;
  return ceil_div(100 * bytes, kSmemPerSmBytes);
}

// CTAs of the tensor-core kernel resident per multiprocessor (shared memory bound) under the
// carveout of n_work sequences.
int32_t ctas_per_sm(int32_t head_dim, int32_t n_work) {
  const int smem_bytes = static_cast<int>(head_dim == 64 ? TcLayout<gpu_bf16, 64>::kSmemBytes
                                                         : TcLayout<gpu_bf16, 128>::kSmemBytes) +
                         kSmemPerCtaReservedBytes;
  const int shared = kSmemPerSmBytes * tc_carveout_percent(head_dim, n_work) / 100;
  return std::max(1, shared / smem_bytes);
}

struct LaunchArgs {
  AttentionArgs attention;
  int32_t n_splits;
  void* workspace;
  bool cluster;  // tensor-core path: merge the splits in a cluster (cluster_merges)
};

template <typename T, int D>
Status launch_typed(const LaunchArgs& la) {
  const AttentionArgs& a = la.attention;
  float* part_o = static_cast<float*>(la.workspace);
  float* part_lse = part_o == nullptr
                        ? nullptr
                        : part_o + static_cast<size_t>(a.n_work) * la.n_splits * a.n_heads * D;
  const int32_t blocks = n_head_blocks(a.n_heads, a.n_kv_heads);
  const DecodeParams<T> p{typed_tensors<T>(a.tensors), part_o, part_lse, a.n_heads, a.n_kv_heads,
                          a.n_heads / a.n_kv_heads,    blocks, a.scale};
  const dim3 grid(la.n_splits, a.n_work, a.n_kv_heads * blocks);
  if constexpr (std::is_same_v<T, float>) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(attention_decode_f32_kernel<D>, grid, dim3(kThreads), 0, a.stream, p));
  } else {
    using L = TcLayout<T, D>;
    const bool cluster = la.cluster;
    const bool early = early_kv_loads(a.n_work);
    auto* kernel = cluster ? (early ? attention_decode_tc_kernel<T, D, true, true>
                                    : attention_decode_tc_kernel<T, D, true, false>)
                           : (early ? attention_decode_tc_kernel<T, D, false, true>
                                    : attention_decode_tc_kernel<T, D, false, false>);
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmemBytes)));
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             static_cast<int>(cudaSharedmemCarveoutMaxShared)));
    const LaunchShape shape{cluster ? static_cast<unsigned>(la.n_splits) : 0u,
                            tc_carveout_percent(D, a.n_work)};
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel_shaped(kernel, grid, dim3(kThreads), L::kSmemBytes, a.stream, shape, p));
    if (cluster) return Status::ok();
  }
  if (la.n_splits > 1) {
    constexpr int kHeadsPerBlock = kThreads / (D / 4);
    const int64_t n_rows = static_cast<int64_t>(a.n_work) * a.n_heads;
    const unsigned merge_blocks = static_cast<unsigned>(ceil_div<int64_t>(n_rows, kHeadsPerBlock));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(attention_decode_merge_kernel<T, D>,
                                                 dim3(merge_blocks), dim3(kThreads), 0, a.stream, p,
                                                 a.n_work, la.n_splits));
  }
  return Status::ok();
}

Status dispatch(const LaunchArgs& a, DType dtype, int32_t head_dim) {
  return dispatch_float_dtype(dtype, "attention_decode", [&](auto type) {
    using T = typename decltype(type)::type;
    return dispatch_tuned_head_dim(head_dim, "attention_decode",
                                   [&](auto d) { return launch_typed<T, decltype(d)::value>(a); });
  });
}

}  // namespace

bool attention_decode_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads) {
  return attention_shapes_supported(dtype, n_heads, n_kv_heads) &&
         (attention_decode_tuned(head_dim) ||
          attention_general_supports(dtype, head_dim, n_heads, n_kv_heads));
}

bool attention_decode_tuned(int32_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

int32_t attention_decode_n_splits(int32_t n_work, int32_t n_heads, int32_t n_kv_heads,
                                  int32_t head_dim, int32_t max_kv_len, int32_t n_sms) {
  if (n_work <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || max_kv_len <= 0 || n_sms <= 0 ||
      !attention_decode_tuned(head_dim)) {
    return 1;
  }
  const int64_t base =
      static_cast<int64_t>(n_work) * n_kv_heads * n_head_blocks(n_heads, n_kv_heads);
  const int64_t target = static_cast<int64_t>(kCtasPerSmTarget) * n_sms;
  if (base < target) {
    const int64_t want = ceil_div(target, base);
    const int64_t by_len = ceil_div<int64_t>(max_kv_len, kMinKeysPerSplit);
    return static_cast<int32_t>(std::clamp<int64_t>(std::min(want, by_len), 1, kMaxSplits));
  }
  // Cost in units of one unsplit CTA's time: waves of `slots` CTAs, each 1/s of the keys. A split
  // count is taken only when it saves at least a tenth over the best so far.
  const int64_t slots = static_cast<int64_t>(n_sms) * ctas_per_sm(head_dim, n_work);
  const int64_t max_s = std::min<int64_t>(kMaxWaveSplits, max_kv_len / kMinKeysPerWaveSplit);
  int64_t best_s = 1;
  double best_cost = static_cast<double>(ceil_div(base, slots));
  for (int64_t s = 2; s <= max_s; ++s) {
    const double cost = static_cast<double>(ceil_div(base * s, slots)) / static_cast<double>(s);
    if (cost < 0.9 * best_cost) {
      best_s = s;
      best_cost = cost;
    }
  }
  return static_cast<int32_t>(best_s);
}

int32_t attention_decode_launch_splits(int32_t n_splits, DType dtype) {
  // A context a little over 512 keys at batch 1 plans 9 splits of one tile, past the cluster size,
  // so its splits would merge in a separate kernel. Up to twice the cluster size, one cluster with
  // up to two tiles per CTA is used instead: it saves the merge launch and its workspace round
  // trip, which cost more than the longer CTAs.
  if (n_splits > kMaxClusterSplits && n_splits <= 2 * kMaxClusterSplits &&
      attention_decode_merges_in_cluster(kMaxClusterSplits, dtype)) {
    return kMaxClusterSplits;
  }
  return n_splits;
}

bool attention_decode_merges_in_cluster(int32_t n_splits, DType dtype) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) &&
         cluster_merges(n_splits, dtype_size_bytes(dtype));
}

size_t attention_decode_workspace_size_bytes(int32_t max_n_work, int32_t n_heads,
                                             int32_t n_kv_heads, int32_t head_dim,
                                             int32_t max_kv_len, int32_t n_sms) {
  if (max_n_work <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || max_kv_len <= 0 || n_sms <= 0 ||
      !attention_decode_tuned(head_dim)) {
    return 0;
  }
  // An upper bound of the plan over every max_kv_len up to the given one: each branch of
  // attention_decode_n_splits is bounded by its limits at the largest max_kv_len.
  const int64_t target = static_cast<int64_t>(kCtasPerSmTarget) * n_sms;
  const int64_t by_len = ceil_div<int64_t>(max_kv_len, kMinKeysPerSplit);
  const int64_t wave_max =
      std::max<int64_t>(1, std::min<int64_t>(kMaxWaveSplits, max_kv_len / kMinKeysPerWaveSplit));
  size_t bytes = 0;
  for (int32_t n = 1; n <= max_n_work; ++n) {
    const int64_t base = static_cast<int64_t>(n) * n_kv_heads * n_head_blocks(n_heads, n_kv_heads);
    const int64_t bound =
        base < target ? std::clamp<int64_t>(std::min(ceil_div(target, base), by_len), 1, kMaxSplits)
                      : wave_max;
    bytes = std::max(bytes, workspace_bytes_for(n, n_heads, head_dim, static_cast<int32_t>(bound)));
  }
  return bytes;
}

Status launch_attention_decode(const AttentionTensors<void>& tensors, int32_t n_work,
                               int32_t max_kv_len, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, DType dtype, float scale, int32_t n_sms,
                               void* workspace, size_t workspace_bytes, KernelStream stream) {
  const bool supported = attention_decode_supports(dtype, head_dim, n_heads, n_kv_heads);
  const int64_t grid_z =
      supported ? static_cast<int64_t>(n_kv_heads) * n_head_blocks(n_heads, n_kv_heads) : 0;
  LITELLAMA_RETURN_IF_ERROR(check_attention_launch("attention_decode", supported, dtype, head_dim,
                                                   n_heads, n_kv_heads, n_work, grid_z,
                                                   "heads {}/{}", n_heads, n_kv_heads));
  if (n_work == 0) return Status::ok();
  if (!attention_decode_tuned(head_dim)) {
    return launch_attention_general(tensors, n_work, /*max_n_new=*/1, n_heads, n_kv_heads, head_dim,
                                    dtype, scale, stream);
  }
  const int32_t n_splits = attention_decode_launch_splits(
      attention_decode_n_splits(n_work, n_heads, n_kv_heads, head_dim, max_kv_len, n_sms), dtype);
  LaunchArgs args{{tensors, n_work, n_heads, n_kv_heads, scale, stream},
                  n_splits,
                  workspace,
                  cluster_merges(n_splits, dtype_size_bytes(dtype))};
  if (args.cluster) {
    const Status clustered = dispatch(args, dtype, head_dim);
    if (clustered.is_ok()) return clustered;
    // A cluster launch the device refuses (too few free multiprocessors in one GPC, e.g. under
    // an MPS limit): merge through the workspace instead.
    (void)cudaGetLastError();
    args.cluster = false;
  }
  if (args.n_splits > 1) {
    // Fewer splits when the workspace holds fewer (a max_kv_len past what it was sized for): each
    // CTA derives its key range from the grid, so any split count gives the same result.
    const size_t per_split = workspace_bytes_for(n_work, n_heads, head_dim, 2) / 2;
    const bool aligned = workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0;
    const size_t fit = aligned ? workspace_bytes / per_split : 0;
    if (fit < static_cast<size_t>(args.n_splits)) {
      args.n_splits = fit >= 2 ? static_cast<int32_t>(fit) : 1;
    }
  }
  return dispatch(args, dtype, head_dim);
}

#else  // LITELLAMA_PORTABLE_KERNELS

// Portable builds (kernels/gpu_runtime.h) compile none of the tuned kernels above (tensor cores
// through inline PTX, thread-block clusters): every head size takes the general path, which plans
// no splits and needs no workspace.
bool attention_decode_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads) {
  return attention_general_supports(dtype, head_dim, n_heads, n_kv_heads);
}

bool attention_decode_tuned(int32_t /*head_dim*/) {
  return false;
}

int32_t attention_decode_n_splits(int32_t /*n_work*/, int32_t /*n_heads*/, int32_t /*n_kv_heads*/,
                                  int32_t /*head_dim*/, int32_t /*max_kv_len*/, int32_t /*n_sms*/) {
  return 1;
}

int32_t attention_decode_launch_splits(int32_t n_splits, DType /*dtype*/) {
  return n_splits;
}

bool attention_decode_merges_in_cluster(int32_t /*n_splits*/, DType /*dtype*/) {
  return false;
}

size_t attention_decode_workspace_size_bytes(int32_t /*max_n_work*/, int32_t /*n_heads*/,
                                             int32_t /*n_kv_heads*/, int32_t /*head_dim*/,
                                             int32_t /*max_kv_len*/, int32_t /*n_sms*/) {
  return 0;
}

Status launch_attention_decode(const AttentionTensors<void>& tensors, int32_t n_work,
                               int32_t /*max_kv_len*/, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, DType dtype, float scale, int32_t /*n_sms*/,
                               void* /*workspace*/, size_t /*workspace_bytes*/,
                               KernelStream stream) {
  const bool supported = attention_decode_supports(dtype, head_dim, n_heads, n_kv_heads);
  LITELLAMA_RETURN_IF_ERROR(
      check_attention_launch("attention_decode", supported, dtype, head_dim, n_heads, n_kv_heads,
                             n_work, supported ? n_heads : 0, "heads {}/{}", n_heads, n_kv_heads));
  if (n_work == 0) return Status::ok();
  return launch_attention_general(tensors, n_work, /*max_n_new=*/1, n_heads, n_kv_heads, head_dim,
                                  dtype, scale, stream);
}

#endif

}  // namespace litellama
