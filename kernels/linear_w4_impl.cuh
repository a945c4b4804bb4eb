// The small-batch W4 GEMV kernel (see linear_w4.h and linear_w4.cu), templated on its warps per
// block and its ring depth so that linear_w4.cu picks one and the linear benchmark can compare
// them. Included by linear_w4.cu and bench/linear_bench.cu only (CUDA, not portable builds).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#include "kernels/linear_w4.h"
#include "kernels/mma_common.cuh"

namespace litellama::w4_detail {

// The small-batch kernel. A block takes 16 output columns (one mma tile of A rows) and all of k;
// its kWarps warps take k in interleaved slices of 128 rows (warp w: slices w, w + kWarps, ...). In
// a slice, lane (g, t) (g = lane / 4, t = lane % 4) loads the 16-byte vectors of columns g and g +
// 8 at input rows kb = slice * 128 + 32 t .. kb + 31, i.e. 16 pairs of consecutive rows each, and
// runs 8 mma.m16n8k16 steps per block of 8 tokens: step s takes pairs 2s and 2s + 1 as the
// fragment's k columns {2t, 2t+1} and {2t+8, 2t+9}, and the same input rows kb + 4s .. kb + 4s + 3
// of x for token g (+ 8 for the second block). The order in which k is summed is free, so this
// "lane owns 32 consecutive rows" mapping needs no shuffle of either operand. Each warp keeps a
// ring of kDepth slices' weights in registers, refilled as each is used (the first kDepth loaded
// before the kernel waits for its input: programmatic dependent launch), and x one slice ahead.
// Partial sums meet in shared memory.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // 128.0 in both halves
  static constexpr float kOffset = 128.0f;
  __device__ static type splat(float v) { return __float2bfloat162_rn(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024.0 in both halves
  static constexpr float kOffset = 1024.0f;
  __device__ static type splat(float v) { return __float2half2_rn(v); }
};

// Weights of rows 2i, 2i + 1 of `word` as two T in one register: (magic + code) - (magic + zero)
// is exact, the product by the scale rounds once.
template <typename T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, int i,
                                                 typename Pair<T>::type offset_zero,
                                                 typename Pair<T>::type scale) {
  using P = Pair<T>;
  const uint32_t bits = ((word >> (4 * i)) & 0x000f000fu) | P::kMagic;
  typename P::type v = *reinterpret_cast<const typename P::type*>(&bits);
  v = __hmul2(__hsub2(v, offset_zero), scale);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// What a lane reads of one slice besides x, for each of its kTiles tiles: the 16-byte vectors of
// its two columns and their group's zero point (plus the magic offset) and scale, as pairs.
template <typename T, int kTiles>
struct SliceWeights {
  uint4 codes[kTiles][2];
  typename Pair<T>::type offset_zero[kTiles][2], scale[kTiles][2];
};

// The group of the 32 input rows lane t of a slice reads: (slice * 4 + t) >> group_shift, where
// group = 32 << group_shift (a power of two), or 0 with group_shift 30 (one group of all k).
template <typename T, int kBlocks, int kWarps, int kDepth, int kTiles>
__global__ void __launch_bounds__(32 * kWarps)
    w4_gemv_kernel(T* __restrict__ y, const T* __restrict__ x, const uint32_t* __restrict__ codes,
                   const uint8_t* __restrict__ zeros, const T* __restrict__ scales, int32_t m,
                   int32_t n, int32_t k, int32_t groups, int32_t group_shift) {
  using P = Pair<T>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n_slices = k / 128;
  // This lane's columns: g and g + 8 of each tile of the block's 16 kTiles columns.
  const uint32_t* w_col[kTiles][2];
  const uint8_t* z_col[kTiles][2];
  const T* s_col[kTiles][2];
  bool ok[kTiles][2];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = (static_cast<int64_t>(blockIdx.x) * kTiles + r) * 16 + g + 8 * h;
      ok[r][h] = col < n;
      w_col[r][h] = codes + col * (k / 8) + 4 * t;
      z_col[r][h] = zeros + col * groups;
      s_col[r][h] = scales + col * groups;
    }
  }
  auto load_weights = [&](int slice, SliceWeights<T, kTiles>& dst) {
    if (slice >= n_slices) return;
    const int gi = (slice * 4 + t) >> group_shift;
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!ok[r][h]) {
          dst.codes[r][h] = uint4{0, 0, 0, 0};
          dst.offset_zero[r][h] = dst.scale[r][h] = P::splat(0.0f);
          continue;
        }
        dst.codes[r][h] = load_streamed_16(w_col[r][h] + slice * 16);
        dst.offset_zero[r][h] = P::splat(P::kOffset + static_cast<float>(z_col[r][h][gi]));
        dst.scale[r][h] = P::splat(to_float(s_col[r][h][gi]));
      }
    }
  };
  auto load_x = [&](int slice, uint4(&dst)[kBlocks][4]) {
    if (slice >= n_slices) return;
    const int kb = slice * 128 + 32 * t;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int token = g + 8 * b;
      const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(token) * k + kb);
#pragma unroll
      for (int v = 0; v < 4; ++v) dst[b][v] = token < m ? __ldg(src + v) : uint4{0, 0, 0, 0};
    }
  };
  float acc[kTiles][kBlocks][4] = {};
  SliceWeights<T, kTiles> ring[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) load_weights(warp + d * kWarps, ring[d]);
  pdl_wait();
  uint4 xv[kBlocks][4], xn[kBlocks][4];
  load_x(warp, xv);
  for (int base = warp; base < n_slices; base += kDepth * kWarps) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int slice = base + d * kWarps;
      if (slice >= n_slices) break;  // warp-uniform
      load_x(slice + kWarps, xn);
      const SliceWeights<T, kTiles>& w = ring[d];
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const int i = 2 * (s & 1);  // pairs 2s, 2s + 1 are pairs i, i + 1 of word s / 2
          uint32_t a[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {  // a[q]: column g + 8 (q & 1), pair i + q / 2
            a[q] = dequant_pair<T>(word_of(w.codes[r][q & 1], s / 2), i + q / 2,
                                   w.offset_zero[r][q & 1], w.scale[r][q & 1]);
          }
#pragma unroll
          for (int b = 0; b < kBlocks; ++b) {
            const uint4& v = xv[b][s / 2];
            mma_16816<T>(acc[r][b], a, (s & 1) ? v.z : v.x, (s & 1) ? v.w : v.y);
          }
        }
      }
      load_weights(slice + kDepth * kWarps, ring[d]);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
        for (int v = 0; v < 4; ++v) xv[b][v] = xn[b][v];
      }
    }
  }
  pdl_launch_dependents();
  constexpr int kSums = kTiles * kBlocks * 4;  // accumulators per lane
  __shared__ float part[kWarps][kSums][32];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int c = 0; c < 4; ++c) part[warp][(r * kBlocks + b) * 4 + c][lane] = acc[r][b][c];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kSums * 32; e += 32 * kWarps) {
    const int src_lane = e & 31, c = (e >> 5) & 3, b = (e >> 7) % kBlocks, r = e / (128 * kBlocks);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += part[w][e >> 5][src_lane];
    // Accumulator c of lane (gs, ts): column gs (+ 8 for c >= 2), token 2 ts + (c & 1).
    const int64_t col =
        (static_cast<int64_t>(blockIdx.x) * kTiles + r) * 16 + (src_lane >> 2) + (c >= 2 ? 8 : 0);
    const int token = 8 * b + 2 * (src_lane & 3) + (c & 1);
    if (col < n && token < m) y[static_cast<int64_t>(token) * n + col] = from_float<T>(sum);
  }
}

// group_shift of the kernel for w's groups (see w4_gemv_kernel); -1 when it cannot take them.
inline int32_t group_shift(const W4Weight& w) {
  if (w.group == w.k) return 30;
  for (int32_t s = 0; s < 16; ++s) {
    if ((32 << s) == w.group) return s;
  }
  return -1;
}

// Launches the kernel for m rows (one block of 8 tokens up to m = 8, two up to 16).
template <typename T, int kWarps, int kDepth1, int kDepth2, int kTiles>
cudaError_t launch_gemv(void* y, const void* x, const W4Weight& w, int32_t m, KernelStream stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(w.n, 16 * kTiles)));
  auto go = [&](auto kernel) {
    return launch_kernel(kernel, grid, dim3(32 * kWarps), 0, stream, static_cast<T*>(y),
                         static_cast<const T*>(x), w.codes, w.zeros,
                         static_cast<const T*>(w.scales), m, w.n, w.k, w.k / w.group,
                         group_shift(w));
  };
  return m <= 8 ? go(w4_gemv_kernel<T, 1, kWarps, kDepth1, kTiles>)
                : go(w4_gemv_kernel<T, 2, kWarps, kDepth2, kTiles>);
}

}  // namespace litellama::w4_detail
