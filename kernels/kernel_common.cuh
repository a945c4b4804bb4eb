// Device helpers shared by the element-wise kernels of this directory (norms, RoPE, activations,
// gathers): the storage type of each compute DType, float conversions, 16-byte vectors and
// block-wide reductions. Included by .cu files only; launchers take DType and dispatch here once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"
#include "kernels/block_trace.h"

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

// Block timeline (kernels/block_trace.h). A traced kernel calls LITELLAMA_TRACE_START() first,
// LITELLAMA_TRACE_RELEASED() after pdl_wait() and LITELLAMA_TRACE_END(kernel, variant) when its
// work is done; without LITELLAMA_BLOCK_TRACE the three expand to nothing.
#if LITELLAMA_BLOCK_TRACE
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

namespace {
// This translation unit's target; set by block_trace_start/stop through the registered setter.
__device__ block_trace_detail::Target g_block_trace_target = {nullptr, nullptr, 0};
cudaError_t set_block_trace_target(const block_trace_detail::Target& target) {
  return cudaMemcpyToSymbol(g_block_trace_target, &target, sizeof target);
}
[[maybe_unused]] const bool g_block_trace_registered =
    block_trace_detail::register_setter(&set_block_trace_target);
}  // namespace

__device__ __forceinline__ void block_trace_record(BlockTraceKernel kernel, uint32_t variant,
                                                   uint64_t start_ns, uint64_t released_ns) {
  const block_trace_detail::Target& t = g_block_trace_target;
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || t.records == nullptr) return;
  BlockTraceRecord r;
  r.start_ns = start_ns;
  r.released_ns = released_ns;
  r.end_ns = global_timer_ns();
  r.kernel = static_cast<uint32_t>(kernel);
  r.variant = variant;
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r.sm));
  r.n_blocks = gridDim.x * gridDim.y * gridDim.z;
  r.reserved = 0;
  const unsigned long long i = atomicAdd(t.count, 1ull);
  if (i < t.capacity) t.records[i] = r;
}
#define LITELLAMA_TRACE_START()                                    \
  const uint64_t trace_start_ns_ = ::litellama::global_timer_ns(); \
  uint64_t trace_released_ns_ = trace_start_ns_
#define LITELLAMA_TRACE_RELEASED() trace_released_ns_ = ::litellama::global_timer_ns()
#define LITELLAMA_TRACE_END(kernel, variant)                                               \
  ::litellama::block_trace_record(kernel, static_cast<uint32_t>(variant), trace_start_ns_, \
                                  trace_released_ns_)
#else
#define LITELLAMA_TRACE_START() (void)0
#define LITELLAMA_TRACE_RELEASED() (void)0
#define LITELLAMA_TRACE_END(kernel, variant) (void)0
#endif

}  // namespace litellama
