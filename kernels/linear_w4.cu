// W4A16 linear layers (see linear_w4.h): the dequantizing kernel that every build has, and the
// small-batch tensor-core GEMV of CUDA builds.
#include "kernels/linear_w4.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/linear_w4_impl.cuh"
#endif

namespace litellama {
namespace {

// One thread per packed word: the word's eight weights of one column, stored as one vector.
template <typename T>
__global__ void w4_dequantize_kernel(T* __restrict__ dense, const uint32_t* __restrict__ codes,
                                     const uint8_t* __restrict__ zeros,
                                     const T* __restrict__ scales, int64_t n_words,
                                     int32_t words_per_col, int32_t group, int32_t groups) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i / words_per_col;
    const int32_t w = static_cast<int32_t>(i - col * words_per_col);
    const int64_t g = col * groups + (8 * w) / group;
    const int32_t zero = zeros[g];
    const float scale = to_float(scales[g]);
    const uint32_t word = codes[i];
    Vec<T, 8> out;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const auto even = static_cast<int32_t>((word >> (4 * j)) & 0xfu);
      const auto odd = static_cast<int32_t>((word >> (4 * j + 16)) & 0xfu);
      out.v[2 * j] = from_float<T>(static_cast<float>(even - zero) * scale);
      out.v[2 * j + 1] = from_float<T>(static_cast<float>(odd - zero) * scale);
    }
    store_vec<T, 8>(dense + i * 8, out);
  }
}

#if !LITELLAMA_PORTABLE_KERNELS

// The small-batch kernel's configuration (litellama-linear-bench --w4 on the H200, bench/
// RESULTS.md): matrices of few tiles (n <= 4096) take 16 warps per block, the others 8; with
// more than 8 tokens a block takes two column tiles, whose weights share each x fragment.
template <typename T>
Status launch_gemv_typed(void* y, const void* x, const W4Weight& w, int32_t m,
                         KernelStream stream) {
  using w4_detail::launch_gemv;
  const bool narrow = w.n <= 4096;
  cudaError_t e;
  if (m <= 8) {
    e = narrow ? launch_gemv<T, 16, 1, 1, 1>(y, x, w, m, stream)
               : launch_gemv<T, 8, 1, 1, 1>(y, x, w, m, stream);
  } else {
    e = narrow ? launch_gemv<T, 16, 1, 1, 2>(y, x, w, m, stream)
               : launch_gemv<T, 8, 1, 1, 2>(y, x, w, m, stream);
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(e);
  return Status::ok();
}

#endif  // !LITELLAMA_PORTABLE_KERNELS

}  // namespace

void pack_w4_codes(const uint8_t* codes, int64_t n, int64_t k, uint32_t* words) {
  for (int64_t col = 0; col < n; ++col) {
    const uint8_t* c = codes + col * k;
    for (int64_t w = 0; w < k / 8; ++w) {
      uint32_t word = 0;
      for (int i = 0; i < 4; ++i) {
        word |= static_cast<uint32_t>(c[8 * w + 2 * i] & 0xf) << (4 * i);
        word |= static_cast<uint32_t>(c[8 * w + 2 * i + 1] & 0xf) << (4 * i + 16);
      }
      words[col * (k / 8) + w] = word;
    }
  }
}

bool w4_layout_supports(int64_t n, int64_t k, int64_t group) {
  return n > 0 && k > 0 && k % 8 == 0 && group > 0 && group % 8 == 0 && k % group == 0 &&
         n <= INT32_MAX && k <= INT32_MAX;
}

bool w4_gemv_supports(DType dtype, int32_t m, int32_t k, int32_t group) {
#if LITELLAMA_PORTABLE_KERNELS
  (void)dtype, (void)m, (void)k, (void)group;
  return false;
#else
  const W4Weight w{nullptr, nullptr, nullptr, 0, k, group};
  return (dtype == DType::kBF16 || dtype == DType::kF16) && m >= 1 && m <= kW4GemvMaxRows &&
         k % 128 == 0 && w4_detail::group_shift(w) >= 0;
#endif
}

Status launch_w4_dequantize(void* dense, const W4Weight& w, DType dtype, KernelStream stream) {
  if (!w4_layout_supports(w.n, w.k, w.group)) {
    return make_error(StatusCode::kInvalidArgument, "w4 dequantize: n {} k {} group {}", w.n, w.k,
                      w.group);
  }
  return dispatch_float_dtype(dtype, "w4 dequantize", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int64_t n_words = static_cast<int64_t>(w.n) * (w.k / 8);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(n_words, threads), 65536);
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(w4_dequantize_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                      0, stream, static_cast<T*>(dense), w.codes, w.zeros,
                      static_cast<const T*>(w.scales), n_words, w.k / 8, w.group, w.k / w.group));
    return Status::ok();
  });
}

Status launch_w4_linear(void* y, const void* x, const W4Weight& w, int32_t m, DType dtype,
                        void* workspace, bool batch_invariant, LinearHandle handle,
                        KernelStream stream) {
  if (m == 0) return Status::ok();
#if !LITELLAMA_PORTABLE_KERNELS
  if (w4_gemv_supports(dtype, m, w.k, w.group)) {
    if (dtype == DType::kBF16) return launch_gemv_typed<__nv_bfloat16>(y, x, w, m, stream);
    return launch_gemv_typed<__half>(y, x, w, m, stream);
  }
#endif
  LITELLAMA_RETURN_IF_ERROR(launch_w4_dequantize(workspace, w, dtype, stream));
  if (batch_invariant) {
    return launch_linear_tiled(y, x, workspace, m, w.n, w.k, dtype, dtype, stream);
  }
  return launch_linear(y, x, workspace, m, w.n, w.k, dtype, dtype, handle, stream);
}

}  // namespace litellama
