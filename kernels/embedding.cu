// Embedding gather: one block row per token, 16-byte copies when the row allows them.
#include "kernels/embedding.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

template <typename T, int N>
__global__ void embedding_kernel(T* __restrict__ out, const int32_t* __restrict__ token_ids,
                                 const T* __restrict__ table, int hidden) {
  pdl_launch_dependents();
  pdl_wait();
  const int t = blockIdx.x;
  const int64_t id = token_ids[t];
  const T* src = table + id * hidden;
  T* dst = out + static_cast<int64_t>(t) * hidden;
  for (int i = threadIdx.x * N; i < hidden; i += blockDim.x * N) {
    store_vec<T, N>(dst + i, load_vec<T, N>(src + i));
  }
}

template <typename T>
Status launch_typed(void* out, const int32_t* token_ids, const void* table, int32_t n_tokens,
                    int32_t hidden, KernelStream stream) {
  const int n = vec_width(hidden, sizeof(T));
  const int threads = std::min(256, std::max(32, (hidden / n + 31) / 32 * 32));
  if (n == 1) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(embedding_kernel<T, 1>, dim3(n_tokens),
                                                 dim3(threads), 0, stream, static_cast<T*>(out),
                                                 token_ids, static_cast<const T*>(table), hidden));
  } else {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(embedding_kernel<T, 16 / sizeof(T)>, dim3(n_tokens), dim3(threads), 0, stream,
                      static_cast<T*>(out), token_ids, static_cast<const T*>(table), hidden));
  }
  return Status::ok();
}

}  // namespace

bool embedding_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_embedding(void* out, const int32_t* token_ids, const void* table, int32_t n_tokens,
                        int32_t hidden, DType dtype, KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "embedding", [&](auto type) {
    return launch_typed<typename decltype(type)::type>(out, token_ids, table, n_tokens, hidden,
                                                       stream);
  });
}

}  // namespace litellama
