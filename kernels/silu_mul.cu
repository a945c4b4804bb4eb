// SiLU(gate) * up over rows [gate | up]: a grid-stride loop over 16-byte vectors of the output.
#include "kernels/silu_mul.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

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
      o.v[j] = from_float<T>(x / (1.0f + expf(-x)) * to_float(u.v[j]));
    }
    store_vec<T, N>(act + row * inter + col, o);
  }
}

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

}  // namespace litellama
