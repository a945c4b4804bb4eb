// The tensor-core decode attention kernel (bf16/fp16) and what its launches share: constants,
// parameters, the CTA's work, K/V tile loads, the in-cluster merge and the partial-result merge
// helpers. Internal to kernels/attention_decode.cu (split-K launches) and
// kernels/attention_decode_cascade.cu (shared-prefix launches); attention_decode.cu's header
// comment describes the kernel. Everything is in an anonymous namespace: each of the two files
// instantiates its own kernels.
#pragma once

#if !LITELLAMA_PORTABLE_KERNELS
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_common.cuh"
#include "kernels/attention_decode.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#include "kernels/mma_common.cuh"

namespace litellama {
namespace {

constexpr int kThreads = 128;     // 4 warps
constexpr int kHeadsPerCta = 16;  // query heads of one group per CTA (the mma M dimension)
constexpr int kCascadeRows = 4 * kHeadsPerCta;  // rows of a cascade task: 16 per warp
constexpr int kBlockN = 64;   // keys per tile (16 per warp on the tensor-core path)
constexpr int kStages = 3;    // tensor-core path: tiles resident in shared memory
constexpr int kF32Keys = 32;  // fp32 path: keys per step (one per lane for the scores)
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
  // Cascade launches (attention_decode.h's DecodeCascade): CTA x runs task x (when x < *n_tasks)
  // and writes its rows to part rows of the workspace; the others stay null.
  const int32_t* n_tasks = nullptr;
  const int32_t* tasks = nullptr;
  const int32_t* members = nullptr;
  const int32_t* part_start = nullptr;
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

// A cascade CTA (grid: task, 1, KV head): task blockIdx.x's keys key_begin .. key_end - 1 of
// sequence table_seq's table, for all query heads of KV head kvh of n_members sequences (rows
// member * group + head in the group). `work` holds the task's first member entry; `token` and
// `kv_len` are unused (the members' tokens come from their entries; every key is in range).
template <typename T>
__device__ __forceinline__ DecodeCta cascade_cta(const DecodeParams<T>& p) {
  const int32_t* t = p.tasks + static_cast<int64_t>(blockIdx.x) * kDecodeTaskFields;
  DecodeCta c;
  c.split = 0;
  c.work = t[kTaskMemberBegin];
  c.kvh = blockIdx.z;
  c.head0 = c.kvh * p.group;
  c.n_rows = t[kTaskMembers] * p.group;
  c.seq = t[kTaskTableSeq];
  c.token = 0;
  c.key_begin = t[kTaskKeyBegin];
  c.key_end = t[kTaskKeyEnd];
  c.kv_len = c.key_end;
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
  // CTAs that fit a multiprocessor's shared memory: registers must not allow fewer.
  static constexpr int kCtasPerSm =
      static_cast<int>(kSmemPerSmBytes / (kSmemBytes + kSmemPerCtaReservedBytes));
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

// Starts the pipeline: tiles 0 .. kStages - 2 of keys key_begin .. key_end - 1 into their
// stages, one commit group per stage (empty past n_tiles). The lookups all come before the copies:
// one round trip for all of them. With kSkip the row of key `skip` is left to load_kv_row.
template <typename T, int D, bool kSkip>
__device__ __forceinline__ void start_kv_stages(T* s_stage, const DecodeParams<T>& p,
                                                const int32_t* slots, int key_begin, int key_end,
                                                int n_tiles, int kvh, int skip) {
  using L = TcLayout<T, D>;
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
      copy_kv_stage<T, D, kSkip>(s_k, s_k + L::kTileElems, p, first_slots[st],
                                 key_begin + st * kBlockN, key_end, kvh, skip);
    }
    cp_async_commit();
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

// Row r's query: head head0 + r of the CTA's token, or in a cascade CTA (kTasks) head r % group of
// member r / group's token. Rows past n_rows are never read.
template <typename T, int D, bool kTasks>
__device__ __forceinline__ const T* query_row(const DecodeParams<T>& p, int work, int n_rows,
                                              int head0, int64_t token, int r) {
  if constexpr (kTasks) {
    if (r >= n_rows) return p.q;
    const int s = p.members[2 * (work + r / p.group)];
    return p.q + (static_cast<int64_t>(p.token_start[s]) * p.n_heads + head0 + r % p.group) * D;
  } else {
    return p.q + (token * p.n_heads + head0 + r) * D;
  }
}

// Rows row0 .. row0 + 15 of Q straight from global memory into mma A fragments (rows at or past
// n_rows are zero): a thread holds rows row0 + lane/4 and row0 + lane/4 + 8, columns
// 2*(lane%4) + {0, 1} and + 8 of each 16-column step.
template <typename T, int D, bool kTasks>
__device__ __forceinline__ void load_q_frags(uint32_t (&q_frag)[D / 16][4],
                                             const DecodeParams<T>& p, int work, int n_rows,
                                             int head0, int64_t token, int row0, int lane) {
  const int r0 = row0 + lane / 4;
  const int r1 = r0 + 8;
  const T* q_r0 = query_row<T, D, kTasks>(p, work, n_rows, head0, token, r0) + 2 * (lane % 4);
  const T* q_r1 = query_row<T, D, kTasks>(p, work, n_rows, head0, token, r1) + 2 * (lane % 4);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const T* q0 = q_r0 + kk * 16;
    const T* q1 = q_r1 + kk * 16;
    q_frag[kk][0] = r0 < n_rows ? *reinterpret_cast<const uint32_t*>(q0) : 0u;
    q_frag[kk][1] = r1 < n_rows ? *reinterpret_cast<const uint32_t*>(q1) : 0u;
    q_frag[kk][2] = r0 < n_rows ? *reinterpret_cast<const uint32_t*>(q0 + 8) : 0u;
    q_frag[kk][3] = r1 < n_rows ? *reinterpret_cast<const uint32_t*>(q1 + 8) : 0u;
  }
}

// The pipeline's step t: waits until tile t has landed for every thread (stage (t-1) % kStages
// is then free), issues tile t + kStages - 1 into it, and returns tile t's K (its V follows
// kTileElems later).
template <typename T, int D>
__device__ __forceinline__ const T* next_kv_tile(T* s_stage, const DecodeParams<T>& p,
                                                 const int32_t* slots, int key_begin, int key_end,
                                                 int n_tiles, int kvh, int t) {
  using L = TcLayout<T, D>;
  cp_async_wait<kStages - 2>();
  __syncthreads();
  const int next = t + kStages - 1;
  if (next < n_tiles) {
    T* s_k = s_stage + (next % kStages) * 2 * L::kTileElems;
    load_kv_stage<T, D>(s_k, s_k + L::kTileElems, p, slots, key_begin + next * kBlockN, key_end,
                        kvh);
  }
  cp_async_commit();
  return s_stage + (t % kStages) * 2 * L::kTileElems;
}

// Raw scores of a warp's 16 query rows against the NT * 8 keys whose K rows start at s_k
// (n-tile nt holds keys nt * 8 .. nt * 8 + 7).
template <typename T, int D, int NT>
__device__ __forceinline__ void tile_scores(float (&s)[NT][4], const uint32_t (&q_frag)[D / 16][4],
                                            const T* s_k, int lane) {
  constexpr int kStride = TcLayout<T, D>::kStride;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < NT / 2; ++j) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, s_k + (j * 16 + lane % 8 + (lane / 16) * 8) * kStride + kk * 16 +
                         ((lane / 8) % 2) * 8);
      mma_16816<T>(s[2 * j], q_frag[kk], b[0], b[1]);
      mma_16816<T>(s[2 * j + 1], q_frag[kk], b[2], b[3]);
    }
  }
}

// The online softmax over those keys (key0 + nt * 8 + ...): scales the scores to base 2, masks
// keys at or past key_end, updates each of the thread's two rows' running max m and sum l (its
// quad's share), rescales o, and leaves the probabilities in s.
template <int D, int NT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&o)[D / 8][4], float scale_log2, int key0,
                                               int key_end, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + nt * 8 + 2 * (lane % 4) + (e & 1);
      s[nt][e] = key < key_end ? s[nt][e] * scale_log2 : -INFINITY;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
    mx = quad_max(mx);
    const float m_new = fmaxf(m[i], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key for this row yet
    const float corr = exp2f(m[i] - m_use);
    m[i] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
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
}

// o += P V for the probabilities s of those keys, whose V rows start at s_v.
template <typename T, int D, int NT>
__device__ __forceinline__ void accumulate_pv(float (&o)[D / 8][4], const float (&s)[NT][4],
                                              const T* s_v, int lane) {
  constexpr int kStride = TcLayout<T, D>::kStride;
#pragma unroll
  for (int j = 0; j < NT / 2; ++j) {
    uint32_t a[4];
    a[0] = pack2<T>(s[2 * j][0], s[2 * j][1]);
    a[1] = pack2<T>(s[2 * j][2], s[2 * j][3]);
    a[2] = pack2<T>(s[2 * j + 1][0], s[2 * j + 1][1]);
    a[3] = pack2<T>(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, s_v + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 +
                               (lane / 16) * 8);
      mma_16816<T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// A cascade task of more than kHeadsPerCta rows (up to kCascadeRows: attention_decode.h's
// attention_decode_cascade_members()): warp w takes rows 16w .. 16w + 15 against all kBlockN keys
// of every tile, so the tile that one pass of shared memory holds serves four times the rows of
// the split-over-keys form, and each row's (m, l, o) stays in one warp (no merge). Every task has
// keys and every key is in range (the table's prefix), so l > 0 for every row.
template <typename T, int D>
__device__ __forceinline__ void cascade_wide_task(const DecodeParams<T>& p, T* s_stage, int work,
                                                  int kvh, int head0, int n_rows, int seq,
                                                  int key_begin, int key_end) {
  using L = TcLayout<T, D>;
  const int n_tiles = ceil_div(key_end - key_begin, kBlockN);
  const int32_t* slots = p.slot_table + p.slot_start[seq];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = warp * 16;
  const bool active = row0 < n_rows;  // warp-uniform: idle warps still load and synchronize
  start_kv_stages<T, D, false>(s_stage, p, slots, key_begin, key_end, n_tiles, kvh, -1);
  uint32_t q_frag[D / 16][4];
  if (active) load_q_frags<T, D, true>(q_frag, p, work, n_rows, head0, 0, row0, lane);
  const float scale_log2 = p.scale * 1.4426950408889634f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  for (int t = 0; t < n_tiles; ++t) {
    const T* s_k = next_kv_tile<T, D>(s_stage, p, slots, key_begin, key_end, n_tiles, kvh, t);
    if (!active) continue;
    float s[kBlockN / 8][4];
    tile_scores<T, D, kBlockN / 8>(s, q_frag, s_k, lane);
    online_softmax<D, kBlockN / 8>(s, m, l, o, scale_log2, key_begin + t * kBlockN, key_end, lane);
    accumulate_pv<T, D, kBlockN / 8>(o, s, s_k + L::kTileElems, lane);
  }
  cp_async_wait<0>();
  if (!active) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + lane / 4 + 8 * i;
    const float sum = quad_sum(l[i]);
    if (r >= n_rows) continue;
    const int part = p.members[2 * (work + r / p.group) + 1];
    const int64_t row = static_cast<int64_t>(part) * p.n_heads + head0 + r % p.group;
    const float inv = 1.0f / sum;
    float* dst = p.part_o + row * D + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<float2*>(dst + nt * 8) =
          make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
    if (lane % 4 == 0) p.part_lse[row] = m[i] + log2f(sum);
  }
}

// kTasks: a cascade launch (cascade_cta; never with kCluster or kEarly).
template <typename T, int D, bool kCluster, bool kEarly, bool kTasks = false>
__global__ void __launch_bounds__(kThreads, kTasks ? TcLayout<T, D>::kCtasPerSm : 0)
    attention_decode_tc_kernel(const DecodeParams<T> p) {
  static_assert(!kTasks || (!kCluster && !kEarly), "cascade CTAs merge through the workspace");
  LITELLAMA_TRACE_START();
  pdl_launch_dependents();  // the o projection may start loading its weights
  if constexpr (!kEarly) {
    pdl_wait();
    LITELLAMA_TRACE_RELEASED();
  }
  if constexpr (kTasks) {
    if (static_cast<int>(blockIdx.x) >= *p.n_tasks) return;  // the grid covers max_tasks
  }
  using L = TcLayout<T, D>;
  constexpr int kStride = L::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_stage = reinterpret_cast<T*>(smem_raw);

  const auto [split, work, kvh, head0, n_rows, seq, token, kv_len, key_begin, key_end] = [&] {
    if constexpr (kTasks) {
      return cascade_cta(p);
    } else {
      return decode_cta(p);
    }
  }();
  // A sequence shorter than the grid's splits leaves the last ones empty: the merge kernel skips
  // them; in a cluster they still take part in the merge, with no keys (log-sum-exp -inf).
  if (!kCluster && key_begin >= kv_len) {
    pdl_wait();  // launch.h: no block leaves before the previous grid is complete
    return;
  }
  if constexpr (kTasks) {
    if (n_rows > kHeadsPerCta) {
      cascade_wide_task<T, D>(p, s_stage, work, kvh, head0, n_rows, seq, key_begin, key_end);
      LITELLAMA_TRACE_END(BlockTraceKernel::kAttention, 2);
      return;
    }
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
  start_kv_stages<T, D, kEarly>(s_stage, p, slots, key_begin, key_end, n_tiles, kvh, newest);
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
  // Q while the first tiles are in flight.
  uint32_t q_frag[D / 16][4];
  load_q_frags<T, D, kTasks>(q_frag, p, work, n_rows, head0, token, 0, lane);

  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

  // Each warp takes 16 keys of every tile for all 16 rows.
  for (int t = 0; t < n_tiles; ++t) {
    const T* s_k = next_kv_tile<T, D>(s_stage, p, slots, key_begin, key_end, n_tiles, kvh, t) +
                   warp * 16 * kStride;
    float s[2][4];
    tile_scores<T, D, 2>(s, q_frag, s_k, lane);
    online_softmax<D, 2>(s, m, l, o, scale_log2, key_begin + t * kBlockN + warp * 16, key_end,
                         lane);
    accumulate_pv<T, D, 2>(o, s, s_k + L::kTileElems, lane);
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
    } else if constexpr (kTasks) {
      // Every task has keys, so l_sum > 0.
      const int part = p.members[2 * (work + r / p.group) + 1];
      const int64_t row = static_cast<int64_t>(part) * p.n_heads + head0 + r % p.group;
      p.part_o[row * D + d] = o_sum / l_sum;
      if (d == 0) p.part_lse[row] = m_max + log2f(l_sum);
    } else {
      store_result<T, D>(p, work, split, head0 + r, token, d, o_sum, l_sum, m_max);
    }
  }
  if constexpr (kCluster) {
    cluster_merge<T, D>(p, s_o + L::kMergeBytes / sizeof(float), n_rows, head0, token);
  }
  LITELLAMA_TRACE_END(BlockTraceKernel::kAttention, kCluster ? 1 : 0);
}

// The merge kernels give one thread 4 dimensions of one (work item, head): false past the last.
template <int D>
__device__ __forceinline__ bool merge_thread(int n_work, int n_heads, int* work, int* head,
                                             int* d) {
  constexpr int kThreadsPerHead = D / 4;
  const int64_t gh = static_cast<int64_t>(blockIdx.x) * (kThreads / kThreadsPerHead) +
                     threadIdx.x / kThreadsPerHead;
  if (gh >= static_cast<int64_t>(n_work) * n_heads) return false;
  *work = static_cast<int>(gh / n_heads);
  *head = static_cast<int>(gh % n_heads);
  *d = (threadIdx.x % kThreadsPerHead) * 4;
  return true;
}

// Dimensions d .. d+3 of out = sum_i w_i o_i / sum_i w_i over the partial rows row0 + i * n_heads
// (i < n_parts, each with keys), w_i = 2^(lse_i - max lse).
template <typename T, int D>
__device__ __forceinline__ void merge_parts(const DecodeParams<T>& p, int64_t row0, int n_parts,
                                            T* dst, int d) {
  float m_max = -INFINITY;
  for (int s = 0; s < n_parts; ++s) m_max = fmaxf(m_max, p.part_lse[row0 + s * p.n_heads]);
  float w_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < n_parts; ++s) {
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
  dst[d] = from_float<T>(acc.x * inv);
  dst[d + 1] = from_float<T>(acc.y * inv);
  dst[d + 2] = from_float<T>(acc.z * inv);
  dst[d + 3] = from_float<T>(acc.w * inv);
}

}  // namespace
}  // namespace litellama

#endif  // !LITELLAMA_PORTABLE_KERNELS
