// SiLU(gate) * up over rows [gate | up]: a grid-stride loop over 16-byte vectors of the output.
#include "kernels/silu_mul.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/fp8_common.cuh"
#endif

namespace litellama {
namespace {

__device__ __forceinline__ float silu_times(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}

template <typename T, int N>
__global__ void silu_mul_kernel(T* __restrict__ act, const T* __restrict__ gate_up, int64_t n_vecs,
                                int inter) {
  pdl_launch_dependents();
  pdl_wait();
  const int vecs_per_row = inter / N;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n_vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs_per_row;
    const int col = static_cast<int>(v - row * vecs_per_row) * N;
    const T* src = gate_up + row * 2 * inter + col;
    const Vec<T, N> g = load_vec<T, N>(src);
    const Vec<T, N> u = load_vec<T, N>(src + inter);
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float x = to_float(g.v[j]);
      o.v[j] = from_float<T>(silu_times(x, to_float(u.v[j])));
    }
    store_vec<T, N>(act + row * inter + col, o);
  }
}

#if !LITELLAMA_PORTABLE_KERNELS
// One block per row: act's values as silu_mul_kernel rounds them, into quantize_row_e4m3.
template <typename T>
__global__ void __launch_bounds__(1024)
    silu_mul_fp8_kernel(uint8_t* __restrict__ q, float* __restrict__ scales,
                        const T* __restrict__ gate_up, int inter) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float scratch[32];
  const T* src = gate_up + static_cast<int64_t>(blockIdx.x) * 2 * inter;
  quantize_row_e4m3(q + static_cast<int64_t>(blockIdx.x) * inter, scales + blockIdx.x, inter,
                    scratch, [&](int i, float(&v)[8]) {
                      const Vec<T, 8> g = load_vec<T, 8>(src + i);
                      const Vec<T, 8> u = load_vec<T, 8>(src + inter + i);
#pragma unroll
                      for (int j = 0; j < 8; ++j) {
                        v[j] =
                            to_float(from_float<T>(silu_times(to_float(g.v[j]), to_float(u.v[j]))));
                      }
                    });
}
#endif

template <typename T, int N>
Status launch_n(void* act, const void* gate_up, int32_t n_tokens, int32_t inter,
                KernelStream stream) {
  const int64_t n_vecs = static_cast<int64_t>(n_tokens) * (inter / N);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(n_vecs, threads), 65536);
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel(silu_mul_kernel<T, N>, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0,
                    stream, static_cast<T*>(act), static_cast<const T*>(gate_up), n_vecs, inter));
  return Status::ok();
}

template <typename T>
Status launch_typed(void* act, const void* gate_up, int32_t n_tokens, int32_t inter,
                    KernelStream stream) {
  if (vec_width(inter, sizeof(T)) == 1)
    return launch_n<T, 1>(act, gate_up, n_tokens, inter, stream);
  return launch_n<T, 16 / sizeof(T)>(act, gate_up, n_tokens, inter, stream);
}

}  // namespace

bool silu_mul_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_silu_mul(void* act, const void* gate_up, int32_t n_tokens, int32_t inter, DType dtype,
                       KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "silu_mul", [&](auto type) {
    return launch_typed<typename decltype(type)::type>(act, gate_up, n_tokens, inter, stream);
  });
}

Status launch_silu_mul_fp8(uint8_t* q, float* scales, const void* gate_up, int32_t n_tokens,
                           int32_t inter, DType dtype, KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  if (inter % 8 != 0 || (dtype != DType::kBF16 && dtype != DType::kF16)) {
    return make_error(StatusCode::kInvalidArgument, "silu_mul_fp8: inter {} dtype {}", inter,
                      dtype_torch_name(dtype));
  }
#if LITELLAMA_PORTABLE_KERNELS
  (void)q, (void)scales, (void)gate_up, (void)stream;
  return make_error(StatusCode::kUnsupported, "silu_mul_fp8: not in portable builds");
#else
  return dispatch_float_dtype(dtype, "silu_mul_fp8", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(silu_mul_fp8_kernel<T>,
                                                 dim3(static_cast<unsigned>(n_tokens)),
                                                 dim3(quantize_row_threads(inter)), 0, stream, q,
                                                 scales, static_cast<const T*>(gate_up), inter));
    return Status::ok();
  });
#endif
}

}  // namespace litellama
