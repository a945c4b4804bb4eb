// Device helpers shared by the element-wise kernels of this directory (norms, RoPE, activations,
// gathers): the storage type of each compute DType, float conversions, 16-byte vectors and
// block-wide reductions. Included by .cu files only; launchers take DType and dispatch here once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

namespace litellama {

template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::kF32> {
  using type = float;
};
template <>
struct StorageOf<DType::kBF16> {
  using type = __nv_bfloat16;
};
template <>
struct StorageOf<DType::kF16> {
  using type = __half;
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// N elements of T moved as one aligned access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Elements per 16-byte access of a row of `cols` elements of `elem_bytes`, or 1 when rows are not
// 16-byte multiples (the row starts would be misaligned).
inline int vec_width(int64_t cols, size_t elem_bytes) {
  const int n = static_cast<int>(16 / elem_bytes);
  return cols % n == 0 ? n : 1;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order, so results are
// reproducible run to run. `scratch` holds 32 floats. Every thread gets the total.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  const int n_warps = blockDim.x >> 5;
  float total = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(total);
}

// Programmatic dependent launch (kernels/launch.h states the rule). No-ops below sm_90 and for
// kernels launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace litellama
