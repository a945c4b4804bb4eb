// The small-batch FP8 GEMV kernel (see linear_fp8.h and linear_fp8.cu), templated on its warps per
// block, ring depth and column tiles so that linear_fp8.cu picks one and the linear benchmark can
// compare them. Included by linear_fp8.cu and bench/linear_bench.cu only (CUDA, not portable).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#include "kernels/linear_fp8.h"
#include "kernels/mma_common.cuh"

namespace litellama::fp8_detail {

// The mapping is the 4-bit GEMV's (linear_w4_impl.cuh): a block takes kTiles tiles of 16 output
// columns and all of k, its warps take k in interleaved slices of 128 rows, and in a slice lane
// (g, t) owns input rows kb = slice * 128 + 32 t .. kb + 31 of columns g and g + 8 (two 16-byte
// vectors of codes each) and of x for tokens g and g + 8. mma step s (8 per slice) takes rows kb +
// 4s .. kb + 4s + 3, i.e. byte word s of the lane's 32 bytes: its bytes 0, 1 are the fragment's k
// columns {2t, 2t+1}, bytes 2, 3 the columns {2t+8, 2t+9}, and x's registers hold the same rows.
// Bytes 2h and 2h + 1 of `word` (two e4m3 codes) as two T in one register, exactly.
//   bf16: each byte goes to the top of its 16-bit half (byte_perm), sign kept and exponent and
//   mantissa shifted down by 4, which is the bf16 whose exponent field is e4m3's exponent field:
//   the value times 2^-120 (subnormal codes included, as bf16 subnormals); one multiply by 2^120
//   restores it.
//   fp16: the hardware conversion (cvt.rn.f16x2.e4m3x2 on compute capability 8.9+).
template <typename T>
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t word, int h) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t v = __byte_perm(word, 0u, h == 0 ? 0x1404u : 0x3424u);
    const uint32_t bits = ((v >> 4) & 0x07f007f0u) | (v & 0x80008000u);
    const __nv_bfloat162 r =
        __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), __float2bfloat162_rn(0x1p120f));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(h == 0 ? word & 0xffffu : word >> 16);
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
  }
}

template <int kTiles>
struct SliceCodes {
  uint4 v[kTiles][2][2];  // [tile][column g, g + 8][rows kb .. kb + 15, kb + 16 .. kb + 31]
};

template <typename T, int kBlocks, int kWarps, int kDepth, int kTiles>
__global__ void __launch_bounds__(32 * kWarps)
    fp8_gemv_kernel(T* __restrict__ y, const T* __restrict__ x, const uint8_t* __restrict__ codes,
                    const float* __restrict__ scales, int32_t m, int32_t n, int32_t k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n_slices = k / 128;
  const uint8_t* w_col[kTiles][2];
  bool ok[kTiles][2];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = (static_cast<int64_t>(blockIdx.x) * kTiles + r) * 16 + g + 8 * h;
      ok[r][h] = col < n;
      w_col[r][h] = codes + col * k + 32 * t;
    }
  }
  auto load_weights = [&](int slice, SliceCodes<kTiles>& dst) {
    if (slice >= n_slices) return;
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          dst.v[r][h][v] =
              ok[r][h] ? load_streamed_16(w_col[r][h] + slice * 128 + 16 * v) : uint4{0, 0, 0, 0};
        }
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
  SliceCodes<kTiles> ring[kDepth];
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
      const SliceCodes<kTiles>& w = ring[d];
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const uint32_t w0 = word_of(w.v[r][0][s / 4], s % 4);
          const uint32_t w1 = word_of(w.v[r][1][s / 4], s % 4);
          const uint32_t a[4] = {e4m3_pair<T>(w0, 0), e4m3_pair<T>(w1, 0), e4m3_pair<T>(w0, 1),
                                 e4m3_pair<T>(w1, 1)};
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
    if (col < n && token < m) {
      y[static_cast<int64_t>(token) * n + col] = from_float<T>(sum * scales[col]);
    }
  }
}

// Launches the kernel for m rows (one block of 8 tokens up to m = 8, two up to 16).
template <typename T, int kWarps, int kDepth1, int kDepth2, int kTiles>
cudaError_t launch_gemv(void* y, const void* x, const Fp8Weight& w, int32_t m,
                        KernelStream stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(w.n, 16 * kTiles)));
  auto go = [&](auto kernel) {
    return launch_kernel(kernel, grid, dim3(32 * kWarps), 0, stream, static_cast<T*>(y),
                         static_cast<const T*>(x), w.codes, w.scales, m, w.n, w.k);
  };
  return m <= 8 ? go(fp8_gemv_kernel<T, 1, kWarps, kDepth1, kTiles>)
                : go(fp8_gemv_kernel<T, 2, kWarps, kDepth2, kTiles>);
}

}  // namespace litellama::fp8_detail
