// Fused residual add + RMSNorm: one block per row. Pass 1 adds and writes the residual and sums
// squares of the stored (rounded) values; pass 2 normalizes, with each thread's first vector of
// the residual kept in registers and its weights loaded before the wait for the previous kernel
// (the launch gives most rows one vector per thread), re-reading any further vectors (from L1/L2,
// written by the same thread), so no row size limit applies.
#include "kernels/add_rmsnorm.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/fp8_common.cuh"
#endif

namespace litellama {
namespace {

// With kFp8 (N == 8), pass 2 hands the normalized values to quantize_row_e4m3 (q, q_scales)
// instead of storing them in `normed`.
template <typename T, int N, bool kFp8 = false>
__global__ void add_rmsnorm_kernel(T* __restrict__ normed, T* __restrict__ residual,
                                   const T* __restrict__ delta, const float* __restrict__ weight,
                                   int hidden, float eps, bool dependents_after_input,
                                   uint8_t* __restrict__ q, float* __restrict__ q_scales) {
  LITELLAMA_TRACE_START();
  // The thread's first vector of the norm's weights before the wait (weights: no kernel writes
  // them), so that the normalizing pass does not wait for them after the sum.
  const int first = threadIdx.x * N;
  float w_first[N];
#pragma unroll
  for (int j = 0; j < N; ++j) w_first[j] = first < hidden ? weight[first + j] : 0.0f;
  if (!dependents_after_input) pdl_launch_dependents();
  pdl_wait();
  LITELLAMA_TRACE_RELEASED();
  if (dependents_after_input) pdl_launch_dependents();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  T* res = residual + row * hidden;
  const T* del = delta != nullptr ? delta + row * hidden : nullptr;
  float sum_sq = 0.0f;
  Vec<T, N> r_first{};  // the thread's first vector of the (updated) residual, kept for pass 2
  for (int i = first; i < hidden; i += blockDim.x * N) {
    Vec<T, N> r = load_vec<T, N>(res + i);
    if (del != nullptr) {
      const Vec<T, N> d = load_vec<T, N>(del + i);
#pragma unroll
      for (int j = 0; j < N; ++j) r.v[j] = from_float<T>(to_float(r.v[j]) + to_float(d.v[j]));
      store_vec<T, N>(res + i, r);
    }
    if (i == first) r_first = r;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float x = to_float(r.v[j]);
      sum_sq += x * x;
    }
  }
  const float total = block_sum(sum_sq, scratch);
  // Correctly rounded 1 / sqrt, as the CPU backend computes it.
  const float inv_rms = __frcp_rn(__fsqrt_rn(total / static_cast<float>(hidden) + eps));
#if !LITELLAMA_PORTABLE_KERNELS
  if constexpr (kFp8) {
    static_assert(N == 8, "quantize_row_e4m3 takes vectors of 8");
    quantize_row_e4m3(q + row * hidden, q_scales + row, hidden, scratch, [&](int i, float(&v)[8]) {
      const bool is_first = i == first;
      const Vec<T, N> r = is_first ? r_first : load_vec<T, N>(res + i);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float w = is_first ? w_first[j] : weight[i + j];
        v[j] = to_float(from_float<T>(to_float(r.v[j]) * inv_rms * w));
      }
    });
    LITELLAMA_TRACE_END(BlockTraceKernel::kAddRmsNorm, 0);
    return;
  }
#endif
  T* out = normed + row * hidden;
  for (int i = first; i < hidden; i += blockDim.x * N) {
    const bool is_first = i == first;
    const Vec<T, N> r = is_first ? r_first : load_vec<T, N>(res + i);
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float w = is_first ? w_first[j] : weight[i + j];
      o.v[j] = from_float<T>(to_float(r.v[j]) * inv_rms * w);
    }
    store_vec<T, N>(out + i, o);
  }
  LITELLAMA_TRACE_END(BlockTraceKernel::kAddRmsNorm, 0);
}

template <typename T>
Status launch_typed(void* normed, void* residual, const void* delta, const float* weight,
                    int32_t n_rows, int32_t hidden, float eps, KernelStream stream, bool after) {
  const int n = vec_width(hidden, sizeof(T));
  const int threads = std::min(1024, std::max(32, (hidden / n + 31) / 32 * 32));
  auto* out = static_cast<T*>(normed);
  auto* res = static_cast<T*>(residual);
  const auto* del = static_cast<const T*>(delta);
  if (n == 1) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(add_rmsnorm_kernel<T, 1>, dim3(n_rows),
                                                 dim3(threads), 0, stream, out, res, del, weight,
                                                 hidden, eps, after, nullptr, nullptr));
  } else {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(add_rmsnorm_kernel<T, 16 / sizeof(T)>, dim3(n_rows), dim3(threads), 0, stream,
                      out, res, del, weight, hidden, eps, after, nullptr, nullptr));
  }
  return Status::ok();
}

}  // namespace

Status launch_add_rmsnorm_fp8(uint8_t* q, float* scales, void* residual, const void* delta,
                              const float* weight, int32_t n_rows, int32_t hidden, float eps,
                              DType dtype, KernelStream stream) {
  if (n_rows == 0) return Status::ok();
  if (hidden % 8 != 0 || (dtype != DType::kBF16 && dtype != DType::kF16)) {
    return make_error(StatusCode::kInvalidArgument, "add_rmsnorm_fp8: hidden {} dtype {}", hidden,
                      dtype_torch_name(dtype));
  }
#if LITELLAMA_PORTABLE_KERNELS
  (void)q, (void)scales, (void)residual, (void)delta, (void)weight, (void)eps, (void)stream;
  return make_error(StatusCode::kUnsupported, "add_rmsnorm_fp8: not in portable builds");
#else
  return dispatch_float_dtype(dtype, "add_rmsnorm_fp8", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int threads = std::min(1024, std::max(32, (hidden / 8 + 31) / 32 * 32));
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(add_rmsnorm_kernel<T, 8, true>, dim3(n_rows), dim3(threads), 0, stream,
                      static_cast<T*>(nullptr), static_cast<T*>(residual),
                      static_cast<const T*>(delta), weight, hidden, eps, false, q, scales));
    return Status::ok();
  });
#endif
}

bool add_rmsnorm_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_add_rmsnorm(void* normed, void* residual, const void* delta, const float* weight,
                          int32_t n_rows, int32_t hidden, float eps, DType dtype,
                          KernelStream stream, bool dependents_after_input) {
  if (n_rows == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "add_rmsnorm", [&](auto type) {
    return launch_typed<typename decltype(type)::type>(normed, residual, delta, weight, n_rows,
                                                       hidden, eps, stream, dependents_after_input);
  });
}

}  // namespace litellama
