// Device helpers shared by the kernels of this directory: the storage type of each compute DType,
// float conversions, 16-byte vectors, rounding, warp and block reductions, and the one dispatch
// from a runtime DType (and attention head size) to template parameters. Included by .cu files
// only. The reductions fix which lanes combine in which order; a kernel whose result must stay
// bit-identical keeps the helper it uses.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/block_trace.h"
#include "kernels/gpu_runtime.h"

namespace litellama {

template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::kF32> {
  using type = float;
};
template <>
struct StorageOf<DType::kBF16> {
  using type = gpu_bf16;
};
template <>
struct StorageOf<DType::kF16> {
  using type = __half;
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(gpu_bf16 x) {
  return gpu_bf16_to_float(x);
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
__device__ __forceinline__ gpu_bf16 from_float<gpu_bf16>(float x) {
  return gpu_float_to_bf16_rn(x);
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

// Rounding of sizes, b > 0: ceil_div is (a + b - 1) / b, which is ceil(a / b) for a >= 0;
// round_up is a rounded up to a multiple of b.
template <typename I>
__host__ __device__ __forceinline__ constexpr I ceil_div(I a, I b) {
  return (a + b - 1) / b;
}
template <typename I>
__host__ __device__ __forceinline__ constexpr I round_up(I a, I b) {
  return ceil_div(a, b) * b;
}

// Butterfly all-reduce over the 32 lanes of a full warp: lane l combines with lane l ^ off for
// off = 16, 8, 4, 2, 1 in that order, so every lane ends with the same value and the order of the
// floating-point operations is fixed.
template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T x, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = op(x, gpu_shfl_xor(x, off));
  return x;
}

// The same over the 4 lanes of a quad (lanes 4q .. 4q+3): off = 1, then 2. The mma.sync fragment
// layout spreads one accumulator row over a quad.
template <typename T, typename Op>
__device__ __forceinline__ T quad_allreduce(T x, Op op) {
  x = op(x, gpu_shfl_xor(x, 1));
  x = op(x, gpu_shfl_xor(x, 2));
  return x;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return max(a, b);
  }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return min(a, b);
  }
};

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
  return warp_allreduce(x, SumOp{});
}
template <typename T>
__device__ __forceinline__ T warp_max(T x) {
  return warp_allreduce(x, MaxOp{});
}
template <typename T>
__device__ __forceinline__ T warp_min(T x) {
  return warp_allreduce(x, MinOp{});
}
template <typename T>
__device__ __forceinline__ T quad_sum(T x) {
  return quad_allreduce(x, SumOp{});
}
template <typename T>
__device__ __forceinline__ T quad_max(T x) {
  return quad_allreduce(x, MaxOp{});
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

// Largest value over the block (blockDim.x a multiple of 32, at most 1024); `scratch` holds 32
// floats. Every thread gets it.
__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  x = warp_max(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  const int n_warps = blockDim.x >> 5;
  return warp_max(lane < n_warps ? scratch[lane] : -INFINITY);
}

// The compute dtypes every kernel of this directory takes.
inline bool is_float_compute_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// The one place where a runtime compute DType becomes the storage type of a template: calls
// f(TypeTag<T>{}) for f32, bf16 and fp16 and returns its Status; other dtypes are kUnsupported,
// with `op` naming the kernel in the message.
template <typename T>
struct TypeTag {
  using type = T;
};
template <typename F>
Status dispatch_float_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<gpu_bf16>{});
    case DType::kF16:
      return f(TypeTag<__half>{});
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
      break;
  }
  return make_error(StatusCode::kUnsupported, "{}: unsupported dtype {}", op,
                    dtype_torch_name(dtype));
}

// The head sizes the tuned attention kernels (prefill and decode) are compiled for: calls
// f(std::integral_constant<int, D>{}) for D = 64 or 128; any other head_dim is kUnsupported.
template <typename F>
Status dispatch_tuned_head_dim(int32_t head_dim, const char* op, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "{}: head_dim {} not supported", op, head_dim);
}

// Programmatic dependent launch (kernels/launch.h states the rule). No-ops below sm_90 and for
// kernels launched without the attribute, and compiled out of portable builds (no HIP form).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !LITELLAMA_PORTABLE_KERNELS
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !LITELLAMA_PORTABLE_KERNELS
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
