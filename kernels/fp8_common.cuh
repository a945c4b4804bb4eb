// Per-token FP8 activation quantization inside a kernel that produces the row (the quantizer of
// kernels/linear_fp8.h, and the norm and SiLU kernels that write their output as e4m3 for the FP8
// GEMM instead of storing it). CUDA builds only (cuda_fp8.h); included by .cu files.
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/kernel_common.cuh"
#include "kernels/linear_fp8.h"

namespace litellama {

// One block quantizes one row of k values (k a multiple of 8): values(i, v) writes elements i ..
// i + 7 to v as float, rounded to the compute dtype as the unquantized kernel would store them, so
// that the codes equal those of quantizing its stored output. The scale is the row's largest |v|
// / 448 (1 for a row of zeros), each code e4m3(v / scale) rounded to nearest, ties to even,
// saturated. values() runs twice per element (the thread's first 8 are kept from the first pass).
// `scratch` holds 32 floats.
template <typename Values>
__device__ __forceinline__ void quantize_row_e4m3(uint8_t* __restrict__ q,
                                                  float* __restrict__ scale, int k, float* scratch,
                                                  Values&& values) {
  const int first = threadIdx.x * 8;
  float kept[8] = {};
  float amax = 0.0f;
  for (int i = first; i < k; i += blockDim.x * 8) {
    float v[8];
    values(i, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      amax = fmaxf(amax, fabsf(v[j]));
      if (i == first) kept[j] = v[j];
    }
  }
  amax = block_max(amax, scratch);
  const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  for (int i = first; i < k; i += blockDim.x * 8) {
    float v[8];
    if (i == first) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = kept[j];
    } else {
      values(i, v);
    }
    uint32_t words[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h] / s, v[4 * h + 1] / s),
                                                   __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * h + 2] / s, v[4 * h + 3] / s),
                                                   __NV_SATFINITE, __NV_E4M3);
      words[h] = lo | (hi << 16);
    }
    *reinterpret_cast<uint2*>(q + i) = make_uint2(words[0], words[1]);
  }
  if (threadIdx.x == 0) *scale = s;
}

// Threads per row for quantize_row_e4m3 over k values: one vector of 8 each where that fits.
inline int quantize_row_threads(int k) {
  return std::min(1024, std::max(32, (k / 8 + 31) / 32 * 32));
}

}  // namespace litellama
