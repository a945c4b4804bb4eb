// The persistent decode-step kernel (see decode_step.h for the phases and why). One block of 8
// warps per multiprocessor (up to 255 registers per thread).
//
// Linear layers: a unit of work is one 16-row tile of the weight matrix (two for gate/up, whose
// gate and up tiles pair up for the SiLU) over one k segment. Units go round-robin to the blocks;
// inside a block the warps take the unit's 64-element chunks in turn (warp w: chunks w, w + 8,
// ...). Each warp streams its chunks through its own ring of shared memory with cp.async, several
// chunks ahead and across unit boundaries, so the bytes in flight cost no registers. The
// arithmetic is kernels/gemv_impl.cuh's: weights as the A operand of mma.m16n8k16, the up to 8
// token rows as B. The warps' accumulators meet in shared memory, and the block reduces them once
// per group of units rather than once per unit. The k segment count of each projection is
// chosen so that units fill the grid evenly (plan_decode_step); segments leave float32 partial
// sums that the consumer adds in a fixed order.
//
// Measured on an H200 while building it (bench/RESULTS.md has the figures):
//   - warps holding their loads in registers spilled them (a register written by a load that is
//     still in flight cannot be moved or stored without waiting for it), which serialized the
//     stream: 1.87 ms per Llama-3.2-1B step; the cp.async ring took it to 1.13 ms;
//   - the per-chunk address arithmetic was the bottleneck with 2 warps per scheduler (an
//     instruction issued every 17 cycles, DRAM 30% busy): row pointers are now computed once
//     per unit, and lane t holds k = 8 t + 32 v so that one instruction covers 64 contiguous
//     bytes of a row;
//   - prefetching the next phase's first weights into L2 before a grid barrier, and merging
//     attention splits through weights staged in shared memory, both measured slower and were
//     taken out;
//   - what did pay (1.146 -> 1.083 ms at batch 1, Qwen2.5-1.5B 2.088 -> 1.709 ms): the weights
//     are read with an L2 evict-first policy, so the stream no longer pushes this kernel's
//     code, its per-thread data, the K/V rows and the partial sums out of L2 (about 5%); the
//     kernel's parameters stay in parameter space (__grid_constant__) instead of a 400-byte copy
//     per thread (100 KB of local memory per multiprocessor, more than its L1 holds); the attention
//     merge copies the splits with cp.async, since loads into registers there completed one after
//     another (4.3 us for 16 KB); and the splits are as few as keep each split's keys in the K/V
//     stage. Issuing the next phase's first weights into the rings between a block's barrier
//     arrival and its wait, and copying a split's K/V rows there, gained less than the run-to-run
//     spread (about 2%) but keep those loads off the phases' starts.
//
// Inputs written inside the kernel by other blocks (partial sums, the residual stream, attention
// output, activations) are read through L2 only (ld.global.cg, cp.async.cg): L1 is not coherent
// across multiprocessors and may still hold a previous layer's lines at the same addresses. K/V
// rows are read with plain loads or copied to shared memory before the attention phase: the only
// K/V row written in this launch is the new token's, written and read by the same block (which
// also puts it into its shared-memory copy).
//
// Grid barrier: a counter that only grows during the launch (arrive with a release, poll with an
// acquire load until it reaches barrier-number x grid); the last block to exit resets it, so the
// next launch, ordered after this one on the stream, starts from zero. Arrival and wait are
// separate calls: between them a block issues the loads that do not depend on the other blocks
// (the next projection's first weights into its rings, a split's K/V rows).
#include "kernels/decode_step.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/mma_common.cuh"

namespace litellama {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kVecs = 2;               // 16-byte vectors per lane, row and chunk
constexpr int kChunk = 64;             // k elements per chunk: 4 lanes x kVecs x 8
constexpr int kRingBytes = 12 * 1024;  // cp.async ring per warp
constexpr int kTile = 16;              // weight rows per mma tile
constexpr int kMaxSeg = 8;             // k segments of a projection
constexpr int kXPad = 32;   // elements of padding per row of the shared input (bank spread)
constexpr int kMaxRep = 8;  // query heads per KV head (one warp each)
constexpr int kRedFloats = kWarps * kDecodeStepMaxTokens + kDecodeStepMaxTokens;
constexpr int kSlotUnits = 8;  // unit accumulators held for grouped reductions (2 groups)
constexpr int kSlotFloats = kSlotUnits * kWarps * 32 * 4;
constexpr int kKvStageBytes = 16 * 1024;  // K/V rows of a block's first attention item
// Attention's split merge reuses the K/V stage and the unit slots (adjacent in shared memory).
constexpr int kMergeFloats = (kKvStageBytes + kSlotFloats * 4) / 4;
constexpr int kExitCountOffset = 32;  // counters (unsigned) in the workspace's first lines
constexpr int kAttnCountOffset = 64;

// How gemv_phase is called: the whole projection; only the first ring stages' weights (issued
// before a grid barrier, as the weights do not depend on what the barrier waits for); or the
// projection whose first stages were so issued.
enum GemvMode : int { kGemvRun = 0, kGemvPrime = 1, kGemvRunPrimed = 2 };

// Ring stages of a projection: 16-byte vectors per lane and stage, and the stage count.
template <int kTiles, bool kSharedX>
__host__ __device__ constexpr int stage_vecs() {
  return (kTiles * 2 * kVecs + (kSharedX ? 0 : kVecs)) * 32;
}
template <int kTiles, bool kSharedX>
__host__ __device__ constexpr int ring_stages() {
  return kRingBytes / (stage_vecs<kTiles, kSharedX>() * 16);
}
// cp.async groups that kGemvPrime of the o projection (one tile, x in global memory) commits;
// the attention phase, which runs between that prime and the projection, waits for all groups
// but these.
constexpr int kOPrimeGroups = ring_stages<1, false>() - 1;

__host__ __device__ constexpr size_t round_up(size_t n, size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

struct Params {
  DecodeStepModel model;
  DecodeStepInputs in;
  int32_t seg_qkv;
  int32_t seg_o;
  int32_t seg_down;
  int32_t n_splits;
  float* logits;
  unsigned* barrier;
  unsigned* exit_count;
  unsigned* attn_count;  // [kDecodeStepMaxTokens, n_kv_heads]
  void* resid[2];        // [m, hidden] each
  float* qkv_part;       // [seg_qkv, m, qkv_dim]
  float* o_part;         // [seg_o, m, hidden]
  float* down_part;      // [seg_down, m, hidden]
  float* attn_po;        // [m, n_kv_heads, n_splits, rep, head_dim]
  float* attn_ml;        // [m, n_kv_heads, n_splits, rep, 2]
  void* attn_out;        // [m, n_heads * head_dim]
  void* act;             // [m, intermediate]
};

// Workspace layout, shared by the size query and the launch.
struct Workspace {
  size_t counters = 0, resid = 0, qkv_part = 0, o_part = 0, down_part = 0, attn_po = 0, attn_ml = 0,
         attn_out = 0, act = 0, total = 0;
};

Workspace workspace_layout(const DecodeStepModel& m) {
  const size_t e = dtype_size_bytes(m.dtype);
  const size_t T = kDecodeStepMaxTokens;
  const size_t q_dim = static_cast<size_t>(m.n_heads) * m.head_dim;
  const size_t qkv_dim = q_dim + 2 * static_cast<size_t>(m.n_kv_heads) * m.head_dim;
  const size_t H = m.hidden;
  Workspace w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at = round_up(at + bytes, 256);
    return here;
  };
  // The grid barrier's counter, the exit counter and the attention counters each start a
  // 128-byte line of their own, apart from the line every block polls.
  w.counters = take(kAttnCountOffset * sizeof(unsigned) +
                    T * static_cast<size_t>(m.n_kv_heads) * sizeof(unsigned));
  w.resid = take(2 * T * H * e);
  w.qkv_part = take(kMaxSeg * T * qkv_dim * sizeof(float));
  w.o_part = take(kMaxSeg * T * H * sizeof(float));
  w.down_part = take(kMaxSeg * T * H * sizeof(float));
  w.attn_po = take(T * kDecodeStepMaxSplits * q_dim * sizeof(float));
  w.attn_ml = take(T * kDecodeStepMaxSplits * static_cast<size_t>(m.n_heads) * 2 * sizeof(float));
  w.attn_out = take(T * q_dim * e);
  w.act = take(T * static_cast<size_t>(m.intermediate) * e);
  w.total = at;
  return w;
}

// An L2 policy under which the streamed weights are the first lines evicted: a step reads far
// more weight bytes than L2 holds, and without it they would push out what is read again soon
// (this kernel's code, the K/V rows, the norm weights and the partial sums).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// cp.async of 16 bytes with an L2 cache policy (always valid).
__device__ __forceinline__ void cp_async_16_hint(void* dst, const void* src, uint64_t policy) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, 16, %2;\n" ::"r"(smem_addr(dst)),
      "l"(src), "l"(policy));
}

__device__ __forceinline__ uint4 load_l2(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

// All threads of the block; a barrier of its own (id 1) so that warps may reach it from
// different points of their loops.
__device__ __forceinline__ void block_barrier() {
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
}

__device__ __forceinline__ uint64_t global_clock() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(ns));
  return ns;
}

// Profiling: block 0 records the device clock at entry `index` (DecodeStepInputs::phase_clock).
__device__ __forceinline__ void record_clock(uint64_t* clock, int index) {
  if (clock != nullptr && blockIdx.x == 0 && threadIdx.x == 0) clock[index] = global_clock();
}

// The grid barrier in two halves, so that a block can issue loads that do not depend on the
// other blocks (the next phase's weights) between its arrival and its wait. Arrival comes first
// because the fence that publishes the block's writes would otherwise also wait for those loads.
__device__ __forceinline__ void grid_arrive(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
  }
}

// Returns the number of barriers passed so far in this launch.
__device__ __forceinline__ int grid_wait(unsigned* counter, unsigned& target, uint64_t* clock) {
  target += gridDim.x;
  if (threadIdx.x == 0) {
    unsigned seen = 0;
    // Poll gently: one L2 slice serves every block's polls.
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= target) break;
      __nanosleep(64);
    }
  }
  __syncthreads();
  const int passed = static_cast<int>(target / gridDim.x);
  record_clock(clock, passed);
  return passed;
}

// Residual update and RMSNorm of all m rows, computed by every block into xs ([m, hidden +
// kXPad]): r = r_prev (or the token's embedding row when r_prev is null) + round(sum of the
// n_seg partial sums), rounded as add_rmsnorm stores it; block b stores its share of r into
// r_next (when not null) for the next consumer; xs = round(r * inv_rms * weight).
template <typename T>
__device__ __noinline__ void residual_norm(const Params& p, int m, const T* r_prev,
                                           const float* part, int n_seg, T* r_next,
                                           const float* norm_w, T* xs, float* red) {
  const int H = p.model.hidden;
  const int xs_stride = H + kXPad;
  const int row_vecs = H / 8;
  const int total = m * row_vecs;
  const auto* embed = static_cast<const T*>(p.model.embed);
  const int32_t* const token_ids = p.in.token_ids;
  const float eps = p.model.rms_eps;
  // The norm weights of this thread's first vector of the second pass, loaded now so that their
  // latency overlaps the first pass rather than following it (one vector per thread covers the
  // rows when m * hidden / 8 <= kThreads, or hidden / 8 == kThreads).
  const int i_first = (static_cast<int>(threadIdx.x) % row_vecs) * 8;
  const float4 nw0 = __ldg(reinterpret_cast<const float4*>(norm_w + i_first));
  const float4 nw1 = __ldg(reinterpret_cast<const float4*>(norm_w + i_first + 4));
  float ss[kDecodeStepMaxTokens] = {};
  for (int v = threadIdx.x; v < total; v += kThreads) {
    const int t = v / row_vecs;
    const int i = (v - t * row_vecs) * 8;
    uint4 raw = r_prev == nullptr ? __ldg(reinterpret_cast<const uint4*>(
                                        embed + static_cast<int64_t>(token_ids[t]) * H + i))
                                  : load_l2(r_prev + static_cast<int64_t>(t) * H + i);
    T* vals = reinterpret_cast<T*>(&raw);
    if (part != nullptr) {
      float s[8] = {};
      for (int seg = 0; seg < n_seg; ++seg) {
        const float* src = part + (static_cast<int64_t>(seg) * m + t) * H + i;
        const float4 a = __ldcg(reinterpret_cast<const float4*>(src));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(src + 4));
        s[0] += a.x, s[1] += a.y, s[2] += a.z, s[3] += a.w;
        s[4] += b.x, s[5] += b.y, s[6] += b.z, s[7] += b.w;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        vals[j] = from_float<T>(to_float(vals[j]) + to_float(from_float<T>(s[j])));
      }
    }
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = to_float(vals[j]);
      q += f * f;
    }
#pragma unroll
    for (int tt = 0; tt < kDecodeStepMaxTokens; ++tt) {
      if (tt == t) ss[tt] += q;
    }
    *reinterpret_cast<uint4*>(xs + t * xs_stride + i) = raw;
    if (r_next != nullptr && v % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x)) {
      *reinterpret_cast<uint4*>(r_next + static_cast<int64_t>(t) * H + i) = raw;
    }
  }
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int tt = 0; tt < kDecodeStepMaxTokens; ++tt) {
    const float s = warp_sum(ss[tt]);
    if (lane == 0) red[warp * kDecodeStepMaxTokens + tt] = s;
  }
  __syncthreads();
  float* inv = red + kWarps * kDecodeStepMaxTokens;
  if (threadIdx.x < m) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += red[w * kDecodeStepMaxTokens + threadIdx.x];
    inv[threadIdx.x] = __frcp_rn(__fsqrt_rn(sum / static_cast<float>(H) + eps));
  }
  __syncthreads();
  for (int v = threadIdx.x; v < total; v += kThreads) {
    const int t = v / row_vecs;
    const int i = (v - t * row_vecs) * 8;
    uint4 raw = *reinterpret_cast<const uint4*>(xs + t * xs_stride + i);
    T* vals = reinterpret_cast<T*>(&raw);
    float4 w0 = nw0, w1 = nw1;
    if (i != i_first) {
      w0 = __ldg(reinterpret_cast<const float4*>(norm_w + i));
      w1 = __ldg(reinterpret_cast<const float4*>(norm_w + i + 4));
    }
    const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) vals[j] = from_float<T>(to_float(vals[j]) * inv[t] * w[j]);
    *reinterpret_cast<uint4*>(xs + t * xs_stride + i) = raw;
  }
  __syncthreads();
}

// One projection y = x @ w^T over n_units = tiles x n_seg units (see the top of this file).
// row_of(tile, r): first weight row of the unit's r-th 16-row tile. epi(tile, seg, row_in_tile,
// token, sums[kTiles]) runs once per (row, token < m) of each unit. x: shared (kSharedX, stride
// ldx) or global memory written earlier in this launch.
//
// Each warp streams its chunks through a ring of shared memory with cp.async (kRingBytes per
// warp, kStages chunks ahead), so the bytes in flight do not cost registers. A lane copies and
// later reads back only its own 16-byte pieces (the fragment layout), so no warp sync is needed.
template <typename T, int kTiles, bool kSharedX, typename RowOf, typename Epi>
__device__ __noinline__ void gemv_phase(int mode, const T* __restrict__ w, int k, int n_units,
                                        int n_seg, int seg_len, const T* x, int ldx, int m,
                                        int n_rows, RowOf row_of, Epi epi, float* slots,
                                        uint4* ring) {
  constexpr int kStageVecs = stage_vecs<kTiles, kSharedX>();
  constexpr int kStages = ring_stages<kTiles, kSharedX>();
  static_assert(kStages >= 2, "ring too small");
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int grid = static_cast<int>(gridDim.x);
  const int block = static_cast<int>(blockIdx.x);
  const int n_ub = block < n_units ? (n_units - 1 - block) / grid + 1 : 0;
  const int nc = seg_len / kChunk;
  const int n_w = warp < nc ? (nc - 1 - warp) / kWarps + 1 : 0;
  const int total = n_ub * n_w;
  const bool token_ok = g < m;
  uint4* my_ring = ring + warp * (kRingBytes / 16) + lane;
  const uint64_t policy = evict_first_policy();

  // Lane (g, t) holds k = 8 t + 32 v + [0, 8) of each 64-element chunk (v < kVecs): one
  // instruction of the warp then covers 64 contiguous bytes of each row. The mma does not care in
  // which order k is summed as long as the weights and x use the same mapping.
  // Loader state: this lane's row pointers (rows g and g + 8 of each tile, at its first k of the
  // unit) for the unit being loaded, and its position.
  const T* ld_rows[kTiles][2];
  const T* ld_x = x;
  int ld_i = 0, ld_j = 0, ld_stage = 0;
  auto unit_k = [&](int i, int* tile) {
    const int u = block + i * grid;
    *tile = u / n_seg;
    return (u - *tile * n_seg) * seg_len + warp * kChunk + 8 * t;
  };
  auto load_unit = [&](int i) {
    int tile = 0;
    const int k0 = unit_k(i, &tile);
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(row_of(tile, r) + g + 8 * h, n_rows - 1);
        ld_rows[r][h] = w + static_cast<int64_t>(row) * k + k0;
      }
    }
    ld_x = x + static_cast<int64_t>(token_ok ? g : 0) * ldx + k0;
  };
  if (total > 0) load_unit(0);
  // Copies the next chunk's weights (when `weights`) and x (when `xs` and x is global) into its
  // ring stage and moves the loader on.
  auto issue = [&](bool weights, bool xs) {
    const int off = ld_j * (kWarps * kChunk);
    uint4* dst = my_ring + ld_stage * kStageVecs;
    if (weights) {
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            cp_async_16_hint(dst + ((r * 2 + h) * kVecs + v) * 32, ld_rows[r][h] + off + 32 * v,
                             policy);
          }
        }
      }
    }
    if (!kSharedX && xs) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        cp_async_16(dst + (kTiles * 2 * kVecs + v) * 32, ld_x + off + 32 * v, token_ok);
      }
    }
    if (++ld_j == n_w) {
      ld_j = 0;
      if (++ld_i < n_ub) load_unit(ld_i);
    }
    ld_stage = ld_stage + 1 == kStages ? 0 : ld_stage + 1;
  };

  float acc[kTiles][4] = {};
  // Unit i's accumulators go to slot i % (2 kGroup); every kGroup units (and after the last) the
  // block meets once and reduces the whole group, so the barrier and the reduction are paid once
  // per group rather than per unit. Two groups alternate: group g's slots are rewritten only after
  // the barrier of group g + 1, which its reducers reach after finishing group g.
  constexpr int kGroup = kSlotUnits / (2 * kTiles);
  constexpr int kUnitFloats = kTiles * kWarps * 32 * 4;
  auto finish = [&](int i) {
    float* slot = slots + (i % (2 * kGroup)) * kUnitFloats;
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
      *reinterpret_cast<float4*>(&slot[((r * kWarps + warp) * 32 + lane) * 4]) =
          make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
    }
    if (i % kGroup != kGroup - 1 && i != n_ub - 1) return;
    block_barrier();
    const int first = i - i % kGroup;
    // Output o of the group: unit first + o / 128; accumulator j = o & 3 of lane li = (o >> 2) &
    // 31: weight row g' + 8 (j >> 1) of the tile, token 2 t' + (j & 1).
    for (int o = threadIdx.x; o < (i - first + 1) * 128; o += kThreads) {
      const int unit = first + (o >> 7);
      const int li = (o >> 2) & 31;
      const int j = o & 3;
      const int token = 2 * (li & 3) + (j & 1);
      if (token >= m) continue;
      const float* us = slots + (unit % (2 * kGroup)) * kUnitFloats;
      float sum[kTiles];
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        sum[r] = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) sum[r] += us[((r * kWarps + v) * 32 + li) * 4 + j];
      }
      const int u = block + unit * grid;
      const int tile = u / n_seg;
      epi(tile, u - tile * n_seg, (li >> 2) + 8 * (j >> 1), token, sum);
    }
  };

  // One commit group per chunk (empty ones past the end keep the count uniform).
  if (mode == kGemvRunPrimed) {
    // The weights of the first stages are on their way (kGemvPrime); x, when global, was not
    // ready then. Its copies form one more group, awaited with the rest before the loop, whose
    // count of groups in flight then holds as in kGemvRun.
    for (int s = 0; s + 1 < kStages && s < total; ++s) issue(false, true);
    if constexpr (!kSharedX) {
      cp_async_commit();
      cp_async_wait<0>();
    }
  } else {
#pragma unroll
    for (int s = 0; s + 1 < kStages; ++s) {
      if (s < total) issue(true, mode != kGemvPrime);
      cp_async_commit();
    }
    if (mode == kGemvPrime) return;
  }
  int cu_i = 0, cu_j = 0, cu_stage = 0;
  const T* cu_x = x;  // shared x: this lane's first k of the unit being computed
  if (kSharedX && total > 0) {
    int tile = 0;
    cu_x = x + g * ldx + unit_k(0, &tile);
  }
  for (int q = 0; q < total; ++q) {
    if (q + kStages - 1 < total) issue(true, true);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    const uint4* src = my_ring + cu_stage * kStageVecs;
    uint4 xv[kVecs];
    if constexpr (kSharedX) {
      const T* xp = cu_x + cu_j * (kWarps * kChunk);
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        xv[v] = token_ok ? *reinterpret_cast<const uint4*>(xp + 32 * v) : make_uint4(0, 0, 0, 0);
      }
    } else {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) xv[v] = src[(kTiles * 2 * kVecs + v) * 32];
    }
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const uint4 lo = src[((r * 2 + 0) * kVecs + v) * 32];
        const uint4 hi = src[((r * 2 + 1) * kVecs + v) * 32];
        const uint32_t first_k[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t second_k[4] = {lo.z, hi.z, lo.w, hi.w};
        mma_16816<T>(acc[r], first_k, xv[v].x, xv[v].y);
        mma_16816<T>(acc[r], second_k, xv[v].z, xv[v].w);
      }
    }
    cu_stage = cu_stage + 1 == kStages ? 0 : cu_stage + 1;
    if (++cu_j == n_w) {
      cu_j = 0;
      finish(cu_i);
      ++cu_i;
      if (kSharedX && cu_i < n_ub) {
        int tile = 0;
        cu_x = x + g * ldx + unit_k(cu_i, &tile);
      }
    }
  }
  cp_async_wait<0>();  // nothing of this phase may land in the ring after it
  if (n_w == 0) {      // more warps than chunks per unit: meet the others at every unit
    for (int i = 0; i < n_ub; ++i) finish(i);
  }
}

__device__ __forceinline__ float exp_or_zero(float a, float max) {
  return a == -INFINITY ? 0.0f : __expf(a - max);
}

// Keys of a block's first attention item that stage_kv copies into shared memory.
template <typename T, int D>
__host__ __device__ constexpr int kv_stage_keys() {
  return kKvStageBytes / (2 * D * static_cast<int>(sizeof(T)));
}

// Item `item` of the attention phase: token t, KV head kvh, and its keys [s0, s1).
struct AttnItem {
  int t, kvh, kv_len, s0, s1;
};
__device__ __forceinline__ AttnItem attn_item(const int32_t* kv_lens, int n_kv, int S, int item) {
  AttnItem it;
  it.t = item / (n_kv * S);
  it.kvh = (item / S) % n_kv;
  const int split = item % S;
  it.kv_len = kv_lens[it.t];
  const int split_len = (it.kv_len + S - 1) / S;
  it.s0 = split * split_len;
  it.s1 = min(it.kv_len, it.s0 + split_len);
  return it;
}

// Starts copying the K/V rows of the block's first attention item of layer L (up to
// kv_stage_keys of them) into kv_st as one cp.async group. Issued before the grid barrier that
// ends the QKV projection: those rows were written by earlier steps, so the copies overlap the
// barrier rather than following the query. The new token's row is not yet written; the
// attention phase puts it into kv_st itself.
template <typename T, int D>
__device__ __noinline__ void stage_kv(const Params& p, const DecodeStepLayer& L, int m, T* kv_st) {
  constexpr int kCap = kv_stage_keys<T, D>();
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  const int n_kv = p.model.n_kv_heads;
  const int S = p.n_splits;
  if (static_cast<int>(blockIdx.x) < m * n_kv * S) {
    const AttnItem it = attn_item(p.in.kv_len, n_kv, S, static_cast<int>(blockIdx.x));
    const int n = min(kCap, max(0, it.s1 - it.s0));
    const int32_t* slots = p.in.slot_table + p.in.slot_start[it.t];
    const auto* k_pool = static_cast<const T*>(L.k_pool);
    const auto* v_pool = static_cast<const T*>(L.v_pool);
    for (int piece = threadIdx.x; piece < 2 * n * kPieces; piece += kThreads) {
      const int which = piece / (n * kPieces);  // 0: K, 1: V
      const int rem = piece - which * n * kPieces;
      const int key = rem / kPieces;
      const int c = rem - key * kPieces;
      const int64_t slot = slots[it.s0 + key];
      const T* src = (which == 0 ? k_pool : v_pool) + (slot * n_kv + it.kvh) * D + c * 8;
      cp_async_16(kv_st + (which * kCap + key) * D + c * 8, src, true);
    }
  }
  cp_async_commit();
}

// Attention of one layer: (token, KV head, split) items, see decode_step.h. The block's first
// item reads its first keys from kv_st (stage_kv); the cp.async groups committed after stage_kv's
// are the o projection's primed stages.
template <typename T, int D>
__device__ __noinline__ void attention_phase(const Params& p, const DecodeStepLayer& L, int m,
                                             float* sm_q, float* sm_w, int* sm_flag, T* kv_st,
                                             float* merge_buf) {
  constexpr int kCap = kv_stage_keys<T, D>();
  constexpr int kStaged = -2;  // slot_of: the key is in kv_st
  cp_async_wait<kOPrimeGroups>();
  __syncthreads();  // every thread's staged copies have landed before any is read or replaced
  constexpr int kHalf = D / 2;
  constexpr int kGl = D / 8;    // lanes per key (8 elements each)
  constexpr int kP = 32 / kGl;  // keys per warp and iteration
  // Everything read from p and L more than once is held in registers: p lives in the kernel's
  // parameter space, and each of the many asm volatile loads below (with their memory clobbers)
  // would otherwise make the compiler fetch a field again before the next load.
  const DecodeStepInputs in = p.in;
  const int n_heads = p.model.n_heads;
  const int n_kv = p.model.n_kv_heads;
  const int n_rep = n_heads / n_kv;
  const int S = p.n_splits;
  const int seg_qkv = p.seg_qkv;
  const float scale = p.model.attention_scale;
  const float rope_scale = p.model.rope_attention_scaling;
  const float* const qkv_part = p.qkv_part;
  float* const attn_po = p.attn_po;
  float* const attn_ml = p.attn_ml;
  unsigned* const attn_count = p.attn_count;
  T* const attn_out = static_cast<T*>(p.attn_out);
  const float* const qkv_bias = L.qkv_bias;
  const int qkv_dim = (n_heads + 2 * n_kv) * D;
  const int groups = kWarps / n_rep;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int items = m * n_kv * S;
  auto* k_pool = static_cast<T*>(L.k_pool);
  auto* v_pool = static_cast<T*>(L.v_pool);
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const AttnItem it = attn_item(in.kv_len, n_kv, S, item);
    const int t = it.t;
    const int kvh = it.kvh;
    const int kv_len = it.kv_len;
    const int s0 = it.s0;
    const int s1 = it.s1;
    const bool has_new = s0 <= kv_len - 1 && kv_len - 1 < s1;
    const int n_staged = item == static_cast<int>(blockIdx.x) ? min(kCap, max(0, s1 - s0)) : 0;
    const bool new_staged = has_new && kv_len - 1 - s0 < n_staged;
    const int64_t slot_new = in.token_slot[t];

    // This warp's first slot numbers are loaded before the query is ready (they do not depend on
    // it). A lane takes keys wb + u * stride + sub (u < kU) per iteration; the slot numbers of the
    // next iteration are loaded one iteration ahead, so only the K/V loads wait.
    constexpr int kU = 4;
    const int hr = warp % n_rep;
    const int grp = warp / n_rep;
    const int sub = lane / kGl;
    const int dl = lane % kGl;
    const int stride = groups * kP;
    const int32_t* slots = in.slot_table + in.slot_start[t];
    auto slot_of = [&](int pos) {
      return pos < s1 ? (pos < s0 + n_staged ? kStaged : slots[pos]) : -1;
    };
    int cur[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      cur[u] = grp < groups ? slot_of(s0 + grp * kP + u * stride + sub) : -1;

    // The group's query heads (and the new K/V): partial sums -> bias -> RoPE, as qkv_rope.
    const float pos = static_cast<float>(in.positions[t]);
    const int freq_row = in.token_freq_row != nullptr ? in.token_freq_row[t] : 0;
    const float* freq = in.inv_freq + static_cast<int64_t>(freq_row) * kHalf;
    const int n_pairs = (n_rep + (has_new ? 2 : 0)) * kHalf;
    for (int i = threadIdx.x; i < n_pairs; i += kThreads) {
      const int hh = i / kHalf;
      const int j = i - hh * kHalf;
      const int head =
          hh < n_rep ? kvh * n_rep + hh : (hh == n_rep ? n_heads + kvh : n_heads + n_kv + kvh);
      float lo = 0.0f, hi = 0.0f;
      for (int seg = 0; seg < seg_qkv; ++seg) {
        const float* src = qkv_part + (static_cast<int64_t>(seg) * m + t) * qkv_dim + head * D;
        lo += __ldcg(src + j);
        hi += __ldcg(src + kHalf + j);
      }
      lo = to_float(from_float<T>(lo));
      hi = to_float(from_float<T>(hi));
      if (qkv_bias != nullptr) {
        lo += qkv_bias[head * D + j];
        hi += qkv_bias[head * D + kHalf + j];
      }
      if (hh == n_rep + 1) {  // v
        T* dst = v_pool + (slot_new * n_kv + kvh) * D;
        dst[j] = from_float<T>(lo);
        dst[kHalf + j] = from_float<T>(hi);
        if (new_staged) {
          T* st = kv_st + (kCap + kv_len - 1 - s0) * D;
          st[j] = from_float<T>(lo);
          st[kHalf + j] = from_float<T>(hi);
        }
        continue;
      }
      float s, c;
      sincosf(pos * freq[j], &s, &c);
      c *= rope_scale;
      s *= rope_scale;
      const T a = from_float<T>(__fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s)));
      const T b = from_float<T>(__fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s)));
      if (hh < n_rep) {
        sm_q[hh * D + j] = to_float(a);
        sm_q[hh * D + kHalf + j] = to_float(b);
      } else {
        T* dst = k_pool + (slot_new * n_kv + kvh) * D;
        dst[j] = a;
        dst[kHalf + j] = b;
        if (new_staged) {
          T* st = kv_st + (kv_len - 1 - s0) * D;
          st[j] = a;
          st[kHalf + j] = b;
        }
      }
    }
    __syncthreads();

    // FlashDecoding over [s0, s1): warp = (group, query head); kGl lanes per key.
    if (grp < groups) {
      float qf[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[e] = sm_q[hr * D + dl * 8 + e];
      const T* kp = k_pool + kvh * D + dl * 8;
      const T* vp = v_pool + kvh * D + dl * 8;
      const int64_t row_stride = static_cast<int64_t>(n_kv) * D;
      float m_i = -INFINITY, l_i = 0.0f, o[8] = {};
      for (int wb = s0 + grp * kP; wb < s1; wb += kU * stride) {
        int next[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) next[u] = slot_of(wb + (kU + u) * stride + sub);
        uint4 kv[kU], vv[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
          if (cur[u] >= 0) {
            const int64_t slot = cur[u];
            kv[u] = *reinterpret_cast<const uint4*>(kp + slot * row_stride);
            vv[u] = *reinterpret_cast<const uint4*>(vp + slot * row_stride);
          } else if (cur[u] == kStaged) {
            const int key = wb + u * stride + sub - s0;
            kv[u] = *reinterpret_cast<const uint4*>(kv_st + key * D + dl * 8);
            vv[u] = *reinterpret_cast<const uint4*>(kv_st + (kCap + key) * D + dl * 8);
          }
        }
        float score[kU];
        float m_new = m_i;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const T* kt = reinterpret_cast<const T*>(&kv[u]);
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d += qf[e] * to_float(kt[e]);
#pragma unroll
          for (int off = 1; off < kGl; off <<= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
          score[u] = cur[u] != -1 ? d * scale : -INFINITY;
          m_new = fmaxf(m_new, score[u]);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) cur[u] = next[u];
        if (m_new == -INFINITY) continue;
        const float corr = __expf(m_i - m_new);
        l_i *= corr;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] *= corr;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          // As attention_decode: the sum takes p in float32, the product with V p rounded to T
          // (its tensor-core operand).
          const float pu = __expf(score[u] - m_new);
          l_i += pu;
          const float pv = to_float(from_float<T>(pu));
          const T* vt = reinterpret_cast<const T*>(&vv[u]);
#pragma unroll
          for (int e = 0; e < 8; ++e) o[e] += pv * to_float(vt[e]);
        }
        m_i = m_new;
      }
      // Merge the kP keys-per-iteration lanes groups of the warp.
#pragma unroll
      for (int off = kGl; off < 32; off <<= 1) {
        const float m_o = __shfl_xor_sync(0xffffffffu, m_i, off);
        const float l_o = __shfl_xor_sync(0xffffffffu, l_i, off);
        const float m_new = fmaxf(m_i, m_o);
        const float c_self = exp_or_zero(m_i, m_new);
        const float c_o = exp_or_zero(m_o, m_new);
        l_i = l_i * c_self + l_o * c_o;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          o[e] = o[e] * c_self + __shfl_xor_sync(0xffffffffu, o[e], off) * c_o;
        }
        m_i = m_new;
      }
      if (sub == 0) {
        float* wp = sm_w + warp * (D + 2);
#pragma unroll
        for (int e = 0; e < 8; ++e) wp[dl * 8 + e] = o[e];
        if (dl == 0) {
          wp[D] = m_i;
          wp[D + 1] = l_i;
        }
      }
    }
    __syncthreads();

    // The split's partial result per query head: warps of the same head merged.
    for (int i = threadIdx.x; i < n_rep * D; i += kThreads) {
      const int h = i / D;
      const int d = i - h * D;
      float mx = -INFINITY;
      for (int g2 = 0; g2 < groups; ++g2) mx = fmaxf(mx, sm_w[(g2 * n_rep + h) * (D + 2) + D]);
      float l = 0.0f, acc = 0.0f;
      for (int g2 = 0; g2 < groups; ++g2) {
        const float* wp = sm_w + (g2 * n_rep + h) * (D + 2);
        const float c = exp_or_zero(wp[D], mx);
        l += wp[D + 1] * c;
        acc += wp[d] * c;
      }
      attn_po[(static_cast<int64_t>(item) * n_rep + h) * D + d] = acc;
      if (d == 0) {
        attn_ml[(static_cast<int64_t>(item) * n_rep + h) * 2] = mx;
        attn_ml[(static_cast<int64_t>(item) * n_rep + h) * 2 + 1] = l;
      }
    }
    // The last split of (t, kvh) to arrive merges all of them.
    __threadfence();
    __syncthreads();
    unsigned* count = attn_count + t * n_kv + kvh;
    if (threadIdx.x == 0) *sm_flag = atomicAdd(count, 1u) == static_cast<unsigned>(S - 1);
    __syncthreads();
    if (*sm_flag) {
      __threadfence();
      // The splits' (max, sum) pairs go to shared memory (sm_w is free again), one load per
      // thread; their partial outputs are copied into merge_buf with cp.async, a group of heads
      // at a time, so that every load is in flight at once (loads into registers here took
      // about one L2 round trip each, as if issued one after another). The o projection's primed
      // groups are older than these and have long landed, so waiting for all groups costs
      // nothing extra.
      const int64_t first = static_cast<int64_t>(t * n_kv + kvh) * S;
      auto* out = attn_out + static_cast<int64_t>(t) * n_heads * D;
      float* ml = sm_w;  // [S, n_rep, 2]
      if (static_cast<int>(threadIdx.x) < S * n_rep) {
        const float2 v =
            __ldcg(reinterpret_cast<const float2*>(attn_ml + (first * n_rep + threadIdx.x) * 2));
        ml[threadIdx.x * 2] = v.x;
        ml[threadIdx.x * 2 + 1] = v.y;
      }
      constexpr int kQuads = D / 4;  // 16-byte pieces of a head's row
      const int heads_per_pass = max(1, min(n_rep, kMergeFloats / (S * D)));
      for (int h0 = 0; h0 < n_rep; h0 += heads_per_pass) {
        const int nh = min(heads_per_pass, n_rep - h0);
        for (int piece = threadIdx.x; piece < S * nh * kQuads; piece += kThreads) {
          const int sh = piece / kQuads;  // s * nh + h
          const int q = piece - sh * kQuads;
          const int sp = sh / nh;
          const int h = sh - sp * nh;
          cp_async_16(merge_buf + sh * D + q * 4,
                      attn_po + ((first + sp) * n_rep + h0 + h) * D + q * 4, true);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();  // merge_buf and ml are complete
        for (int i = threadIdx.x; i < nh * D; i += kThreads) {
          const int h = i / D;
          const int d = i - h * D;
          const int hh = h0 + h;
          float mx = -INFINITY;
          for (int sp = 0; sp < S; ++sp) mx = fmaxf(mx, ml[(sp * n_rep + hh) * 2]);
          float l = 0.0f, acc = 0.0f;
          for (int sp = 0; sp < S; ++sp) {
            const float c = exp_or_zero(ml[(sp * n_rep + hh) * 2], mx);
            l += ml[(sp * n_rep + hh) * 2 + 1] * c;
            acc += merge_buf[(sp * nh + h) * D + d] * c;
          }
          out[(kvh * n_rep + hh) * D + d] = from_float<T>(acc / l);
        }
        __syncthreads();  // before the next pass overwrites merge_buf
      }
      if (threadIdx.x == 0) *count = 0;
    }
    __syncthreads();
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    decode_step_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const DecodeStepModel& M = p.model;
  const int m = p.in.n_tokens;
  const int H = M.hidden;
  const int q_dim = M.n_heads * D;
  const int qkv_dim = q_dim + 2 * M.n_kv_heads * D;
  const int inter = M.intermediate;
  const int ldxs = H + kXPad;
  const size_t xs_bytes = round_up(static_cast<size_t>(m) * ldxs * sizeof(T), 16);
  T* xs = reinterpret_cast<T*>(smem);
  auto* ring = reinterpret_cast<uint4*>(smem + xs_bytes);
  T* kv_st = reinterpret_cast<T*>(smem + xs_bytes + kWarps * kRingBytes);
  float* slots = reinterpret_cast<float*>(smem + xs_bytes + kWarps * kRingBytes + kKvStageBytes);
  // Attention's split merge reuses kv_st and slots (adjacent, kMergeFloats): neither is in use
  // then.
  float* merge_buf = reinterpret_cast<float*>(kv_st);
  float* red = slots + kSlotFloats;
  float* sm_q = red + kRedFloats;
  float* sm_w = sm_q + kMaxRep * D;
  int* sm_flag = reinterpret_cast<int*>(sm_w + kWarps * (D + 2));

  // The residual stream's two buffers (selected, not indexed, so that they stay in registers).
  T* const resid0 = static_cast<T*>(p.resid[0]);
  T* const resid1 = static_cast<T*>(p.resid[1]);
  auto resid = [&](int i) { return i == 0 ? resid0 : resid1; };
  const T* attn_out = static_cast<const T*>(p.attn_out);
  T* act = static_cast<T*>(p.act);
  auto plain_rows = [](int tile, int) { return tile * kTile; };
  auto pair_rows = [inter](int tile, int r) { return r * inter + tile * kTile; };
  auto partial_to = [m](float* out, int n) {
    return [out, n, m](int tile, int seg, int row_in_tile, int token, const float* sum) {
      const int row = tile * kTile + row_in_tile;
      if (row < n) out[(static_cast<int64_t>(seg) * m + token) * n + row] = sum[0];
    };
  };
  auto silu_mul = [act, inter](int tile, int, int row_in_tile, int token, const float* sum) {
    const float gate = to_float(from_float<T>(sum[0]));
    const float up = to_float(from_float<T>(sum[1]));
    act[static_cast<int64_t>(token) * inter + tile * kTile + row_in_tile] =
        from_float<T>(gate / (1.0f + expf(-gate)) * up);
  };

  // The projections. Each is called twice: kGemvPrime issues its first weights before the grid
  // barrier that precedes it, so that they stream in while the grid waits; kGemvRunPrimed then
  // computes it.
  auto qkv = [&](const DecodeStepLayer& L, int mode) {
    gemv_phase<T, 1, true>(mode, static_cast<const T*>(L.qkv), H, (qkv_dim / kTile) * p.seg_qkv,
                           p.seg_qkv, H / p.seg_qkv, xs, ldxs, m, qkv_dim, plain_rows,
                           partial_to(p.qkv_part, qkv_dim), slots, ring);
  };
  auto o_proj = [&](const DecodeStepLayer& L, int mode) {  // kOPrimeGroups counts its prime
    gemv_phase<T, 1, false>(mode, static_cast<const T*>(L.o), q_dim, (H / kTile) * p.seg_o, p.seg_o,
                            q_dim / p.seg_o, attn_out, q_dim, m, H, plain_rows,
                            partial_to(p.o_part, H), slots, ring);
  };
  auto gate_up = [&](const DecodeStepLayer& L, int mode) {
    gemv_phase<T, 2, true>(mode, static_cast<const T*>(L.gate_up), H, inter / kTile, 1, H, xs, ldxs,
                           m, 2 * inter, pair_rows, silu_mul, slots, ring);
  };
  auto down = [&](const DecodeStepLayer& L, int mode) {
    gemv_phase<T, 1, false>(mode, static_cast<const T*>(L.down), inter, (H / kTile) * p.seg_down,
                            p.seg_down, inter / p.seg_down, act, inter, m, H, plain_rows,
                            partial_to(p.down_part, H), slots, ring);
  };
  auto lm_head = [&](int mode) {
    gemv_phase<T, 1, true>(mode, static_cast<const T*>(M.lm_head), H, (M.vocab + kTile - 1) / kTile,
                           1, H, xs, ldxs, m, M.vocab, plain_rows, partial_to(p.logits, M.vocab),
                           slots, ring);
  };

  unsigned target = 0;
  int cur = 0;
  uint64_t* const clock = p.in.phase_clock;
  record_clock(clock, 0);
  qkv(M.layers[0], kGemvPrime);
  for (int l = 0; l < M.n_layers; ++l) {
    const DecodeStepLayer& L = M.layers[l];  // global memory: no per-thread copy
    if (l == 0) {
      residual_norm<T>(p, m, nullptr, nullptr, 0, resid(0), L.input_norm, xs, red);
    } else {
      residual_norm<T>(p, m, resid(cur), p.down_part, p.seg_down, resid(cur ^ 1), L.input_norm, xs,
                       red);
      cur ^= 1;
    }
    qkv(L, kGemvRunPrimed);
    grid_arrive(p.barrier);
    stage_kv<T, D>(p, L, m, kv_st);  // one cp.async group, then the o projection's primed ones
    o_proj(L, kGemvPrime);
    grid_wait(p.barrier, target, clock);
    attention_phase<T, D>(p, L, m, sm_q, sm_w, sm_flag, kv_st, merge_buf);
    grid_arrive(p.barrier);
    grid_wait(p.barrier, target, clock);
    o_proj(L, kGemvRunPrimed);
    grid_arrive(p.barrier);
    gate_up(L, kGemvPrime);
    grid_wait(p.barrier, target, clock);
    residual_norm<T>(p, m, resid(cur), p.o_part, p.seg_o, resid(cur ^ 1), L.post_norm, xs, red);
    cur ^= 1;
    gate_up(L, kGemvRunPrimed);
    grid_arrive(p.barrier);
    down(L, kGemvPrime);
    grid_wait(p.barrier, target, clock);
    down(L, kGemvRunPrimed);
    grid_arrive(p.barrier);
    if (l + 1 < M.n_layers) {
      qkv(M.layers[l + 1], kGemvPrime);
    } else {
      lm_head(kGemvPrime);
    }
    grid_wait(p.barrier, target, clock);
  }
  residual_norm<T>(p, m, resid(cur), p.down_part, p.seg_down, nullptr, M.final_norm, xs, red);
  lm_head(kGemvRunPrimed);

  // The last block out resets the barrier for the next launch (and reads the end clock).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.exit_count, 1u) == gridDim.x - 1) {
      if (p.in.phase_clock != nullptr) {
        p.in.phase_clock[decode_step_clock_entries(M.n_layers) - 1] = global_clock();
      }
      *p.barrier = 0;
      *p.exit_count = 0;
      __threadfence();
    }
  }
}

template <typename T, int D>
auto kernel_for() {
  return decode_step_kernel<T, D>;
}

using KernelFn = void (*)(Params);

KernelFn pick_kernel(DType dtype, int32_t head_dim) {
  if (dtype == DType::kBF16) {
    return head_dim == 64 ? kernel_for<__nv_bfloat16, 64>() : kernel_for<__nv_bfloat16, 128>();
  }
  return head_dim == 64 ? kernel_for<__half, 64>() : kernel_for<__half, 128>();
}

size_t smem_bytes_for(const DecodeStepModel& m, int32_t n_tokens) {
  const size_t xs =
      round_up(static_cast<size_t>(n_tokens) * (m.hidden + kXPad) * dtype_size_bytes(m.dtype), 16);
  return xs + kWarps * kRingBytes + kKvStageBytes +
         (kSlotFloats + kRedFloats + kMaxRep * m.head_dim + kWarps * (m.head_dim + 2)) *
             sizeof(float) +
         16;
}

// k segments for a projection of `tiles` units of k: the fewest that keep the busiest block's
// share (plus a per-unit overhead of 128 elements) smallest.
int32_t choose_segments(int64_t tiles, int32_t k, int32_t grid) {
  int32_t best = 1;
  int64_t best_cost = INT64_MAX;
  for (int32_t n = 1; n <= kMaxSeg; ++n) {
    if (k % (kChunk * n) != 0) continue;
    const int64_t rounds = (tiles * n + grid - 1) / grid;
    const int64_t cost = rounds * (k / n + 128);
    if (cost < best_cost) {
      best_cost = cost;
      best = n;
    }
  }
  return best;
}

// Raises the kernel's shared-memory limit to what the plan needs and checks that its grid can be
// co-resident. Done once per kernel, device and size (the host calls stay out of graph captures
// after a step's first, eager launch).
Status prepare(KernelFn kernel, const DecodeStepPlan& plan) {
  struct Prepared {
    KernelFn kernel;
    int device;
    size_t smem_bytes;
    int grid;
  };
  static std::mutex mu;
  static std::vector<Prepared> done;
  int device = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  for (const Prepared& d : done) {
    if (d.kernel == kernel && d.device == device && d.smem_bytes >= plan.smem_bytes &&
        d.grid >= plan.grid) {
      return Status::ok();
    }
  }
  int smem_optin = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (plan.smem_bytes > static_cast<size_t>(smem_optin)) {
    return make_error(StatusCode::kUnsupported,
                      "the persistent decode kernel needs {} bytes of shared memory per block "
                      "(the device allows {})",
                      plan.smem_bytes, smem_optin);
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(plan.smem_bytes)));
  int per_sm = 0, sms = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, plan.smem_bytes));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (static_cast<int64_t>(per_sm) * sms < plan.grid) {
    return make_error(StatusCode::kUnsupported,
                      "the persistent decode kernel's {} blocks cannot be co-resident ({} per "
                      "multiprocessor, {} multiprocessors)",
                      plan.grid, per_sm, sms);
  }
  done.push_back(Prepared{kernel, device, plan.smem_bytes, plan.grid});
  return Status::ok();
}

}  // namespace

bool decode_step_supports(const DecodeStepModel& m) {
  if (m.dtype != DType::kBF16 && m.dtype != DType::kF16) return false;
  if (m.head_dim != 64 && m.head_dim != 128) return false;
  if (m.n_kv_heads <= 0 || m.n_heads % m.n_kv_heads != 0) return false;
  if (m.n_heads / m.n_kv_heads > kMaxRep) return false;
  if (m.has_qk_norm) return false;
  const int64_t q_dim = static_cast<int64_t>(m.n_heads) * m.head_dim;
  return m.n_layers > 0 && m.vocab > 0 && m.hidden > 0 && m.hidden % kChunk == 0 &&
         q_dim % kChunk == 0 && m.intermediate > 0 && m.intermediate % kChunk == 0;
}

DecodeStepPlan plan_decode_step(const DecodeStepModel& m, int32_t n_tokens, int32_t max_kv_len,
                                int32_t n_sms) {
  DecodeStepPlan plan;
  plan.grid = std::max(1, n_sms);
  const int32_t q_dim = m.n_heads * m.head_dim;
  const int32_t qkv_dim = q_dim + 2 * m.n_kv_heads * m.head_dim;
  plan.seg_qkv = choose_segments(qkv_dim / kTile, m.hidden, plan.grid);
  plan.seg_o = choose_segments(m.hidden / kTile, q_dim, plan.grid);
  plan.seg_down = choose_segments(m.hidden / kTile, m.intermediate, plan.grid);
  const int32_t groups = std::max(1, n_tokens * m.n_kv_heads);
  const int32_t by_grid = std::max(1, plan.grid / groups);
  // The fewest splits whose keys fit the block's K/V stage (stage_kv): the merge of the splits
  // costs more than a split's own keys while they are staged.
  plan.attn_stage_keys =
      kKvStageBytes / (2 * m.head_dim * static_cast<int32_t>(dtype_size_bytes(m.dtype)));
  const int32_t by_len =
      std::max(1, (std::max(1, max_kv_len) + plan.attn_stage_keys - 1) / plan.attn_stage_keys);
  plan.attn_splits = std::min({by_grid, by_len, kDecodeStepMaxSplits});
  plan.smem_bytes = smem_bytes_for(m, n_tokens);
  return plan;
}

Status decode_step_prepare(const DecodeStepModel& model, const DecodeStepPlan& plan) {
  if (!decode_step_supports(model)) {
    return make_error(StatusCode::kUnsupported,
                      "the persistent decode kernel does not run this model");
  }
  return prepare(pick_kernel(model.dtype, model.head_dim), plan);
}

size_t decode_step_workspace_size_bytes(const DecodeStepModel& model) {
  return workspace_layout(model).total;
}

Status launch_decode_step(const DecodeStepModel& model, const DecodeStepInputs& inputs,
                          const DecodeStepPlan& plan, float* logits, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  if (!decode_step_supports(model)) {
    return make_error(StatusCode::kUnsupported,
                      "the persistent decode kernel does not run this model");
  }
  if (inputs.n_tokens < 1 || inputs.n_tokens > kDecodeStepMaxTokens || plan.grid < 1 ||
      plan.attn_splits < 1 || plan.attn_splits > kDecodeStepMaxSplits) {
    return make_error(StatusCode::kInvalidArgument,
                      "persistent decode step of {} tokens with {} splits", inputs.n_tokens,
                      plan.attn_splits);
  }
  const int32_t q_dim = model.n_heads * model.head_dim;
  auto whole_chunks = [](int32_t k, int32_t seg) {
    return seg >= 1 && seg <= kMaxSeg && k % (kChunk * seg) == 0;
  };
  if (plan.smem_bytes < smem_bytes_for(model, inputs.n_tokens) ||
      !whole_chunks(model.hidden, plan.seg_qkv) || !whole_chunks(q_dim, plan.seg_o) ||
      !whole_chunks(model.intermediate, plan.seg_down)) {
    return make_error(StatusCode::kInvalidArgument,
                      "persistent decode plan (segments {}/{}/{}, {} shared bytes) does not fit "
                      "this model and {} tokens",
                      plan.seg_qkv, plan.seg_o, plan.seg_down, plan.smem_bytes, inputs.n_tokens);
  }
  const Workspace ws = workspace_layout(model);
  if (workspace == nullptr || workspace_bytes < ws.total) {
    return make_error(StatusCode::kInvalidArgument,
                      "persistent decode step needs {} workspace bytes (got {})", ws.total,
                      workspace_bytes);
  }
  const KernelFn kernel = pick_kernel(model.dtype, model.head_dim);
  LITELLAMA_RETURN_IF_ERROR(prepare(kernel, plan));

  auto* base = static_cast<char*>(workspace);
  Params p{};
  p.model = model;
  p.in = inputs;
  p.seg_qkv = plan.seg_qkv;
  p.seg_o = plan.seg_o;
  p.seg_down = plan.seg_down;
  p.n_splits = plan.attn_splits;
  p.logits = logits;
  auto* counters = reinterpret_cast<unsigned*>(base + ws.counters);
  p.barrier = counters;
  p.exit_count = counters + kExitCountOffset;
  p.attn_count = counters + kAttnCountOffset;
  const size_t resid_bytes =
      static_cast<size_t>(kDecodeStepMaxTokens) * model.hidden * dtype_size_bytes(model.dtype);
  p.resid[0] = base + ws.resid;
  p.resid[1] = base + ws.resid + resid_bytes;
  p.qkv_part = reinterpret_cast<float*>(base + ws.qkv_part);
  p.o_part = reinterpret_cast<float*>(base + ws.o_part);
  p.down_part = reinterpret_cast<float*>(base + ws.down_part);
  p.attn_po = reinterpret_cast<float*>(base + ws.attn_po);
  p.attn_ml = reinterpret_cast<float*>(base + ws.attn_ml);
  p.attn_out = base + ws.attn_out;
  p.act = base + ws.act;

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(plan.grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = plan.smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p));
  return Status::ok();
}

}  // namespace litellama
