// The small-batch tensor-core GEMV kernel (see gemv.h and gemv.cu), templated on its tile
// configuration so that gemv.cu picks one per shape and the linear benchmark can compare them.
// Included by gemv.cu and bench/linear_bench.cu only.
//
// A unit is kTiles tiles of 16 weight rows and all of k. Two kernels: gemv_unit_kernel takes one
// unit per block (the grid runs in waves of blocks); gemv_loop_kernel has no more blocks than are
// resident at once, each taking units blockIdx.x, blockIdx.x + gridDim.x, ... in turn, and where
// k is a multiple of kPipe * kWarps chunks its ring of weight loads runs on from the end of one
// unit into the start of the next, so a block's weight stream does not stop between units. The
// block's kWarps warps take k in interleaved chunks of 32 * kVecs (warp w: chunks w, w + kWarps,
// ...). A chunk is 2 * kVecs mma.m16n8k16 steps per tile:
//   A (16 rows x 16 k) = weights, straight from global memory into registers: lane (g, t) loads
//     the kVecs consecutive 16-byte vectors at k0 = chunk * 32 kVecs + 8 kVecs t of rows g and
//     g + 8 (a 4-lane group reads 64 kVecs contiguous bytes of a row). The dot product does not
//     care in which order k is summed, so for each vector the fragment's "logical" k columns
//     {2t, 2t+1, 2t+8, 2t+9} are its elements {0, 1, 2, 3} (first mma) and {4, 5, 6, 7} (second);
//   B (16 k x 8 tokens) = x, with the same mapping: lane (g, t) loads the same vectors of token g
//     (tokens g >= m read nothing and hold zeros).
// Before griddepcontrol.wait each warp loads its first kPipe chunks of weights (they do not depend
// on the previous kernel); after it, the next kernel may launch, and x is read through L1 (every
// block reads all of it). Weights bypass L1. Warps' partial sums meet in shared memory (double-
// buffered in the loop kernel, so one barrier per unit suffices); 128 threads finish one
// (row, token) pair each and apply the epilogue:
//   kStore        y[t, row] = sum (rounded to OutT)
//   kResidualAdd  y[t, row] = round(y[t, row] + round(sum)): the residual stream update that
//                 add_rmsnorm would do, element by element (each element has one owner)
//   kSiluMul      tiles 0 / 1 = gate / up rows: act[t, row] = silu(round(g)) * round(u)
//   kRope         tiles 0 / 1 = first / second half of one head's rows, or one tile of 8
//                 rotary pairs (its rows g and g + 8 are element j of each half, so one thread's
//                 accumulators hold both): qkv_rope's bias, rotate-half RoPE and the Q / K-pool /
//                 V-pool stores (no q/k RMSNorm)
// With kSegs > 1 (one tile, kStore / kResidualAdd) a unit is 16 / kSegs weight rows whose k is cut
// into kSegs segments: mma row q is row q % (16 / kSegs) over segment q / (16 / kSegs), and column
// c is token c / kSegs over segment c % kSegs (so m * kSegs <= 8); the entries where the two
// segments agree are the partial sums, which the epilogue adds in segment order. More, smaller
// units for matrices of few tiles, each block still covering all of k (no cross-block reduction).
// Rounding follows the unfused kernels, so outputs match them up to the order of float32 sums.
// With kNorm (gemv.h's GemvRmsNorm), x is the residual stream before an RMSNorm whose weight is
// folded into w: each lane also sums the squares of the x vectors it loads, off the mma's
// dependency chain, and the epilogue scales the sums by the row's 1 / rms before its rounding.
//
// What the kernel deliberately does not do (none paid in the decode step; the figures are in the
// history of bench/RESULTS.md):
//   - split k across blocks or a thread-block cluster: every block covers all of k, and matrices
//     of few tiles get more warps per tile or k segments within the block instead;
//   - transform x as the main loop reads it (SiLU(gate) * up, or an RMSNorm from per-block sums of
//     squares): at batch 1 only the 4 lanes of token 0 in each warp read x, so arithmetic on x
//     lengthens every chunk's critical path. The RMSNorm is folded as a scale of the sums (kNorm)
//     instead, which leaves x as stored; gate/up keeps its separate norm kernel;
//   - normalize the input rows in a prologue (the separate norm kernel costs less), or let the
//     next kernel launch before this one's wait rather than after it;
//   - stage the end of each weight row in shared memory before the wait: weights go from global
//     memory straight into registers.
// The loop kernel serves the large paired shapes, where one block per unit leaves the weight
// stream well short of a plain read. Its ring state for the next unit lives in registers, so it
// keeps one chunk in flight (deeper rings cost occupancy), and gemv.cu uses it only where k is a
// multiple of the ring, so that the ring runs on; the refilled case serves the benchmark's sweep.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemv.h"
#include "kernels/gemv_epilogue.cuh"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#include "kernels/mma_common.cuh"

namespace litellama::gemv_detail {

constexpr int kTileRows = 16;

enum class Epilogue { kStore, kResidualAdd, kSiluMul, kRope };

struct Params {
  const void* x;
  const void* w;
  void* y;
  int32_t m;
  int32_t n;  // rows of w
  int32_t k;
  // Unit u's first row is (u / blocks_per_group) * group_rows + (u % blocks_per_group) *
  // unit_stride; rows g and g + 8 of its tile r (g < 8) are first + r * tile_stride + g and that
  // + upper_stride. Tiles of 16 consecutive rows: unit_stride 16, upper_stride 8. A tile of rotary
  // pairs (kRope, one tile): unit_stride 8, upper_stride head_dim / 2, so rows g and g + 8 of the
  // tile are element j of the two halves of one head.
  int32_t blocks_per_group;
  int32_t group_rows;
  int32_t unit_stride;
  int32_t upper_stride;
  int32_t n_units;  // units of kTiles tiles; block b takes units b, b + gridDim.x, ...
  int32_t tile_stride;
  int32_t ldy;    // elements between rows of y
  GemvRope rope;  // kRope
  // kNorm: x holds un-normalized rows and w the norm's weight folded into its columns; every sum is
  // scaled by 1 / sqrt(mean(x_row^2) + norm_eps) before its epilogue.
  float norm_eps;
};

__device__ __forceinline__ int64_t unit_first_row(const Params& p, int unit) {
  return static_cast<int64_t>(unit / p.blocks_per_group) * p.group_rows +
         static_cast<int64_t>(unit % p.blocks_per_group) * p.unit_stride;
}

// Row h * 8 + g of tile r of the unit whose first row is `first`.
__device__ __forceinline__ int64_t tile_row(const Params& p, int64_t first, int r, int g, int h) {
  return first + static_cast<int64_t>(r) * p.tile_stride + g + h * p.upper_stride;
}

// This lane's pointer to mma row g + 8 h of tile r of the unit whose first row is `first`, at its
// first k element of the unit (lane t of a row's 4 reads 8 kVecs elements from 8 kVecs t); null
// past n. With kSegs > 1 a unit is one tile of kTileRows / kSegs weight rows whose k is cut into
// kSegs segments: mma row q is weight row q % (kTileRows / kSegs) over segment q / (kTileRows /
// kSegs).
template <typename T, int kSegs, int kVecs>
__device__ __forceinline__ const T* lane_row(const Params& p, int64_t first, int r, int g, int h,
                                             int t) {
  int64_t row;
  int64_t k0 = 8 * kVecs * t;
  if constexpr (kSegs == 1) {
    row = tile_row(p, first, r, g, h);
  } else {
    constexpr int kRows = kTileRows / kSegs;
    const int q = g + 8 * h;
    row = first + q % kRows;
    k0 += static_cast<int64_t>(q / kRows) * (p.k / kSegs);
  }
  return row < p.n ? static_cast<const T*>(p.w) + row * p.k + k0 : nullptr;
}

// This lane's x pointer as the B operand: column g of the mma is token g / kSegs over k segment
// g % kSegs (token g without segments). token_ok: the token exists (m * kSegs <= 8 columns).
template <typename T, int kSegs, int kVecs>
__device__ __forceinline__ const T* lane_x(const Params& p, int g, int t, bool& token_ok) {
  const int token = g / kSegs;
  token_ok = token < p.m;
  return static_cast<const T*>(p.x) + static_cast<int64_t>(token) * p.k +
         static_cast<int64_t>(g % kSegs) * (p.k / kSegs) + 8 * kVecs * t;
}

// Sum of the squares of the 8 elements of v, in float32.
template <typename T>
__device__ __forceinline__ float sum_squares(const uint4& v) {
  const T* e = reinterpret_cast<const T*>(&v);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float f = to_float(e[i]);
    s = fmaf(f, f, s);
  }
  return s;
}

// Chunk `chunk` of this lane's rows of a unit (kVecs 16-byte vectors of rows g and g + 8 of each
// tile) into dst; a null row (past n) reads nothing and holds zeros.
template <typename T, int kTiles, int kVecs>
__device__ __forceinline__ void load_unit_chunk(uint4 (&dst)[kTiles][2][kVecs],
                                                const T* const (&rows)[kTiles][2], int chunk) {
  constexpr int kChunk = 32 * kVecs;
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        dst[r][h][v] =
            rows[r][h] != nullptr
                ? load_streamed_16(rows[r][h] + static_cast<int64_t>(chunk) * kChunk + 8 * v)
                : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// The k loop of one unit for warp `warp`: its chunks warp, warp + kWarps, ... of the unit's
// tiles, whose weights arrive in the ring a (slot u holds chunk base + u * kWarps); after a slot's
// mma steps, refill(a[u], chunk + kPipe * kWarps) issues its next load. Accumulates into acc and,
// with kNorm, the squares of this lane's x elements into squares.
template <typename T, int kTiles, int kWarps, int kVecs, int kPipe, bool kNorm, typename Refill>
__device__ __forceinline__ void accumulate_unit(uint4 (&a)[kPipe][kTiles][2][kVecs], const T* x_row,
                                                bool token_ok, int warp, int n_chunks,
                                                float (&acc)[kTiles][4], float& squares,
                                                const Refill& refill) {
  constexpr int kChunk = 32 * kVecs;
  for (int base = warp; base < n_chunks; base += kPipe * kWarps) {
    uint4 xv[kPipe][kVecs];
#pragma unroll
    for (int u = 0; u < kPipe; ++u) {
      const int chunk = base + u * kWarps;
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const T* src = x_row + static_cast<int64_t>(chunk) * kChunk + 8 * v;
        xv[u][v] = token_ok && chunk < n_chunks ? __ldg(reinterpret_cast<const uint4*>(src))
                                                : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kPipe; ++u) {
      const int chunk = base + u * kWarps;
      if (chunk < n_chunks) {
#pragma unroll
        for (int r = 0; r < kTiles; ++r) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            const uint4& lo = a[u][r][0][v];
            const uint4& hi = a[u][r][1][v];
            const uint32_t first_k[4] = {lo.x, hi.x, lo.y, hi.y};
            const uint32_t second_k[4] = {lo.z, hi.z, lo.w, hi.w};
            mma_16816<T>(acc[r], first_k, xv[u][v].x, xv[u][v].y);
            mma_16816<T>(acc[r], second_k, xv[u][v].z, xv[u][v].w);
          }
        }
        refill(a[u], chunk + kPipe * kWarps);
        if constexpr (kNorm) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) squares += sum_squares<T>(xv[u][v]);
        }
      }
    }
  }
}

// Thread i < 128 of the block finishes accumulator j = i & 3 of lane i >> 2 of unit `unit`: row
// g' + 8 (j >> 1) of the tile, token 2 t' + (j & 1), from the warps' partial sums. A tile of
// rotary pairs (kRope with one tile) is finished by threads i < 64 instead, thread i taking rows
// g' = i >> 3 and g' + 8 (the pair's two halves) for token i & 7.
template <typename T, typename OutT, int kTiles, Epilogue E, int kWarps, bool kNorm, int kSegs>
__device__ __forceinline__ void finish_unit(const Params& p, int unit,
                                            const float (&partial)[kWarps][kTiles][32][4],
                                            const float (&row_squares)[kNorm ? kWarps : 1][8]) {
  constexpr bool kPairTile = E == Epilogue::kRope && kTiles == 1;
  constexpr int kSums = kPairTile ? 2 : kTiles;
  const int i = threadIdx.x;
  int row_in_tile, token;
  float sum[kSums] = {};
  if constexpr (kSegs > 1) {
    // Thread i < 8 kRows takes weight row i >> 3 of the unit for token i & 7: the sum of entry
    // (row s kRows + i >> 3, column token kSegs + s) over the segments s, in segment order.
    constexpr int kRows = kTileRows / kSegs;
    row_in_tile = i >> 3;
    token = i & 7;
    if (row_in_tile >= kRows || token >= p.m) return;
#pragma unroll
    for (int s = 0; s < kSegs; ++s) {
      const int q = s * kRows + row_in_tile;
      const int c = token * kSegs + s;
      const int lane = (q & 7) * 4 + (c >> 1);
      const int e = (q >> 3) * 2 + (c & 1);
#pragma unroll
      for (int v = 0; v < kWarps; ++v) sum[0] += partial[v][0][lane][e];
    }
  } else if constexpr (kPairTile) {
    row_in_tile = i >> 3;
    token = i & 7;
    if (i >= 64 || token >= p.m) return;
    const int lane = 4 * row_in_tile + (token >> 1);
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      sum[0] += partial[v][0][lane][token & 1];
      sum[1] += partial[v][0][lane][2 + (token & 1)];
    }
  } else {
    row_in_tile = (i >> 4) + 8 * ((i & 3) >> 1);
    token = 2 * ((i >> 2) & 3) + (i & 1);
    if (token >= p.m) return;
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int v = 0; v < kWarps; ++v) sum[r] += partial[v][r][i >> 2][i & 3];
    }
  }
  const int64_t block_row = unit_first_row(p, unit);
  if constexpr (kNorm) {
    float total = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) total += row_squares[v][token];
    const float inv_rms = gemv_epilogue::inv_rms(total, p.k, p.norm_eps);
#pragma unroll
    for (int r = 0; r < kSums; ++r) sum[r] *= inv_rms;
  }
  auto* y = static_cast<OutT*>(p.y) + static_cast<int64_t>(token) * p.ldy;
  if constexpr (E == Epilogue::kStore || E == Epilogue::kResidualAdd) {
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
      const int64_t row = block_row + static_cast<int64_t>(r) * p.tile_stride + row_in_tile;
      if (row >= p.n) continue;
      if constexpr (E == Epilogue::kStore) {
        y[row] = from_float<OutT>(sum[r]);
      } else {
        gemv_epilogue::residual_add(&y[row], sum[r]);
      }
    }
  } else if constexpr (E == Epilogue::kSiluMul) {
    const int64_t row = block_row + row_in_tile;
    if (row < p.tile_stride) y[row] = gemv_epilogue::silu_mul<T>(sum[0], sum[1]);
  } else {  // kRope: element j of the head's first half paired with half + j
    const int head = unit / p.blocks_per_group;
    const int j = (unit % p.blocks_per_group) * p.unit_stride + row_in_tile;
    gemv_epilogue::rope_store<T>(p.rope, head, j, token, sum[0], sum[1]);
  }
}

// One unit per block (blockIdx.x).
template <typename T, typename OutT, int kTiles, Epilogue E, int kWarps, int kVecs, int kPipe,
          bool kNorm, int kSegs>
__global__ void __launch_bounds__(kWarps * 32) gemv_unit_kernel(const Params p) {
  LITELLAMA_TRACE_START();
  constexpr int kChunk = 32 * kVecs;
  __shared__ __align__(16) float partial[kWarps][kTiles][32][4];
  __shared__ float row_squares[kNorm ? kWarps : 1][8];  // kNorm: per warp, per token

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n_chunks = p.k / kSegs / kChunk;
  const int64_t block_row = unit_first_row(p, static_cast<int>(blockIdx.x));

  // Row pointers of this lane (mma rows g and g + 8 of each tile); null past n (read nothing).
  const T* rows[kTiles][2];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[r][h] = lane_row<T, kSegs, kVecs>(p, block_row, r, g, h, t);
  }
  uint4 a[kPipe][kTiles][2][kVecs];
  auto load_chunk = [&](uint4(&dst)[kTiles][2][kVecs], int chunk) {
    load_unit_chunk<T, kTiles, kVecs>(dst, rows, chunk);
  };
#pragma unroll
  for (int u = 0; u < kPipe; ++u) {
    const int chunk = warp + u * kWarps;
    if (chunk < n_chunks) load_chunk(a[u], chunk);
  }
  pdl_wait();
  LITELLAMA_TRACE_RELEASED();
  // The next kernel may start its own weight loads now; it still waits for this grid to finish.
  pdl_launch_dependents();

  bool token_ok;
  const T* x_row = lane_x<T, kSegs, kVecs>(p, g, t, token_ok);
  float acc[kTiles][4] = {};
  float squares = 0.0f;  // kNorm: of this lane's elements of token g
  accumulate_unit<T, kTiles, kWarps, kVecs, kPipe, kNorm>(
      a, x_row, token_ok, warp, n_chunks, acc, squares,
      [&](uint4(&dst)[kTiles][2][kVecs], int next) {
        if (next < n_chunks) load_chunk(dst, next);
      });
  if constexpr (kNorm) {
    // The 4 lanes of a token group cover each chunk of the warp; the warps cover all chunks.
    squares = quad_sum(squares);
    if (t == 0) row_squares[warp][g] = squares;
  }

#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
    *reinterpret_cast<float4*>(&partial[warp][r][lane][0]) =
        make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    finish_unit<T, OutT, kTiles, E, kWarps, kNorm, kSegs>(p, static_cast<int>(blockIdx.x), partial,
                                                          row_squares);
  }
  LITELLAMA_TRACE_END(BlockTraceKernel::kGemv, static_cast<int>(E) * 16 + kSegs);
}

// Units blockIdx.x, blockIdx.x + gridDim.x, ... in turn.
template <typename T, typename OutT, int kTiles, Epilogue E, int kWarps, int kVecs, int kPipe,
          bool kNorm, int kSegs>
__global__ void __launch_bounds__(kWarps * 32) gemv_loop_kernel(const Params p) {
  LITELLAMA_TRACE_START();
  constexpr int kChunk = 32 * kVecs;
  // Double-buffered by unit, so one barrier per unit suffices: a warp writes a buffer again only
  // after the next unit's barrier, which the epilogue threads of this unit reach after reading it.
  __shared__ __align__(16) float partial[2][kWarps][kTiles][32][4];
  __shared__ float row_squares[2][kNorm ? kWarps : 1][8];  // kNorm: per warp, per token

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n_chunks = p.k / kSegs / kChunk;
  // The ring runs on into the next unit when every warp's last chunk slot of a unit is slot
  // kPipe - 1 (then the next unit's chunk for slot u is the same as this unit's first).
  const bool ring_continues = n_chunks % (kPipe * kWarps) == 0;

  // This lane's rows of a unit: mma rows g and g + 8 of each tile r (null past n: read nothing).
  struct UnitRows {
    const T* ptr[kTiles][2];
  };
  auto unit_rows = [&](int unit) {
    const int64_t block_row = unit_first_row(p, unit);
    UnitRows u;
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) u.ptr[r][h] = lane_row<T, kSegs, kVecs>(p, block_row, r, g, h, t);
    }
    return u;
  };
  uint4 a[kPipe][kTiles][2][kVecs];
  auto load_chunk = [&](uint4(&dst)[kTiles][2][kVecs], const UnitRows& rows, int chunk) {
    load_unit_chunk<T, kTiles, kVecs>(dst, rows.ptr, chunk);
  };
  auto fill_ring = [&](const UnitRows& rows) {
#pragma unroll
    for (int u = 0; u < kPipe; ++u) {
      const int chunk = warp + u * kWarps;
      if (chunk < n_chunks) load_chunk(a[u], rows, chunk);
    }
  };

  int unit = static_cast<int>(blockIdx.x);
  UnitRows rows = unit_rows(unit);
  fill_ring(rows);
  pdl_wait();
  LITELLAMA_TRACE_RELEASED();
  // The next kernel may start its own weight loads now; it still waits for this grid to finish.
  pdl_launch_dependents();

  bool token_ok;
  const T* x_row = lane_x<T, kSegs, kVecs>(p, g, t, token_ok);
  for (int iter = 0; unit < p.n_units; ++iter, unit += static_cast<int>(gridDim.x)) {
    const int next_unit = unit + static_cast<int>(gridDim.x);
    const bool prefetch_next = ring_continues && next_unit < p.n_units;
    const UnitRows next_rows = prefetch_next ? unit_rows(next_unit) : rows;
    float acc[kTiles][4] = {};
    float squares = 0.0f;  // kNorm: of this lane's elements of token g
    accumulate_unit<T, kTiles, kWarps, kVecs, kPipe, kNorm>(
        a, x_row, token_ok, warp, n_chunks, acc, squares,
        [&](uint4(&dst)[kTiles][2][kVecs], int next) {
          if (next < n_chunks) {
            load_chunk(dst, rows, next);
          } else if (prefetch_next) {
            load_chunk(dst, next_rows, next - n_chunks);
          }
        });
    const int buf = iter & 1;
    if constexpr (kNorm) {
      // The 4 lanes of a token group cover each chunk of the warp; the warps cover all chunks.
      squares = quad_sum(squares);
      if (t == 0) row_squares[buf][warp][g] = squares;
    }
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
      *reinterpret_cast<float4*>(&partial[buf][warp][r][lane][0]) =
          make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    }
    __syncthreads();
    if (threadIdx.x < 128)
      finish_unit<T, OutT, kTiles, E, kWarps, kNorm, kSegs>(p, unit, partial[buf],
                                                            row_squares[buf]);
    if (next_unit < p.n_units) {
      rows = prefetch_next ? next_rows : unit_rows(next_unit);
      if (!prefetch_next) fill_ring(rows);
    }
  }
  LITELLAMA_TRACE_END(BlockTraceKernel::kGemvLoop, static_cast<int>(E) * 16 + kSegs);
}

// The current device's multiprocessors, or 132 (an H100/H200's count) where unreadable.
inline int64_t sm_count() {
  const int64_t device_sms = current_device_sm_count();
  return device_sms > 0 ? device_sms : 132;
}

// Blocks of `kernel` resident at once per multiprocessor with `threads` threads (1 if unreadable).
// Read once per kernel by its callers: a stale value (another device model in the same process)
// costs only speed.
template <typename Kernel>
int query_blocks_per_sm(Kernel kernel, int threads) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 1;
  }
  return n > 0 ? n : 1;
}

template <typename T, typename OutT, int kTiles, Epilogue E, int kWarps, int kVecs, int kPipe,
          bool kNorm, int kSegs>
int unit_blocks_per_sm() {
  static const int n = query_blocks_per_sm(
      gemv_unit_kernel<T, OutT, kTiles, E, kWarps, kVecs, kPipe, kNorm, kSegs>, kWarps * 32);
  return n;
}

// Launches one configuration. x, w, y / ldy and the epilogue's arguments come from p; the row
// mapping is set here: kStore / kResidualAdd: consecutive tiles over n rows, or with kSegs > 1
// units of kTileRows / kSegs rows whose k is cut into kSegs segments (the mma's rows hold the
// rows' segments and its columns the tokens' segments, so m * kSegs <= 8 and k must be a multiple
// of kSegs chunks); kSiluMul: gate rows [0, n / 2) paired with up rows [n / 2, n); kRope: the two
// halves of each head of rope.head_dim rows, as a tile of 16 rows of each half (two tiles) or as
// one tile of 8 rotary pairs (rows j and head_dim / 2 + j). Without kLoop a block takes one unit
// (kTiles tiles): the grid runs in waves, each block loading its first chunks anew. With kLoop the
// grid has at most as many blocks as are resident at once, each taking the same number of units in
// turn (up to one less), its ring of loads running on into its next unit where k allows. Returns
// the launch's error.
template <typename T, typename OutT, int kTiles, Epilogue E, int kWarps, int kVecs, int kPipe,
          bool kNorm = false, bool kLoop = false, int kSegs = 1>
cudaError_t launch(Params p, KernelStream stream) {
  static_assert(kSegs == 1 || kSegs == 2 || kSegs == 4 || kSegs == 8, "segments divide a tile");
  static_assert(kSegs == 1 || (kTiles == 1 && !kNorm &&
                               (E == Epilogue::kStore || E == Epilogue::kResidualAdd)),
                "k segments: single tiles of the plain epilogues");
  if (p.m * kSegs > kGemvMaxRows || p.k % (kSegs * 32 * kVecs) != 0) return cudaErrorInvalidValue;
  int64_t units = 0;
  p.unit_stride = kTileRows;
  p.upper_stride = kTileRows / 2;
  if constexpr (E == Epilogue::kSiluMul) {
    static_assert(kTiles == 2, "SiLU pairs one tile of gate rows with one of up rows");
    p.blocks_per_group = 1;
    p.group_rows = kTileRows;
    p.tile_stride = p.n / 2;
    units = ceil_div<int64_t>(p.n / 2, kTileRows);
  } else if constexpr (E == Epilogue::kRope) {
    static_assert(kTiles == 1 || kTiles == 2, "RoPE takes a tile of each half or of pairs");
    const int half = p.rope.head_dim / 2;  // a multiple of 16 (gemv_rope_supports)
    p.group_rows = p.rope.head_dim;
    if constexpr (kTiles == 2) {
      p.blocks_per_group = half / kTileRows;
      p.tile_stride = half;
    } else {
      p.blocks_per_group = half / (kTileRows / 2);
      p.unit_stride = kTileRows / 2;
      p.upper_stride = half;
      p.tile_stride = 0;
    }
    units = static_cast<int64_t>(p.n / p.rope.head_dim) * p.blocks_per_group;
  } else {
    p.blocks_per_group = 1;
    p.group_rows = kTileRows * kTiles / kSegs;
    p.tile_stride = kTileRows;
    units = ceil_div<int64_t>(p.n, p.group_rows);
  }
  p.n_units = static_cast<int32_t>(units);
  if constexpr (!kLoop) {
    return launch_kernel(gemv_unit_kernel<T, OutT, kTiles, E, kWarps, kVecs, kPipe, kNorm, kSegs>,
                         dim3(static_cast<unsigned>(units)), dim3(kWarps * 32), 0, stream, p);
  } else {
    auto* kernel = gemv_loop_kernel<T, OutT, kTiles, E, kWarps, kVecs, kPipe, kNorm, kSegs>;
    static const int per_sm = query_blocks_per_sm(kernel, kWarps * 32);
    const int64_t resident = sm_count() * per_sm;
    const int64_t rounds = ceil_div<int64_t>(units, resident);
    const int64_t blocks = ceil_div<int64_t>(units, rounds);
    return launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, stream,
                         p);
  }
}

}  // namespace litellama::gemv_detail
