// Vision tower operations (kernels/vision_ops.h): row-wise kernels, one block per row, and the
// dense attention of one image as batched GEMMs around a float32 softmax.
#include "kernels/vision_ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__global__ void layer_norm_kernel(T* out, const T* in, const float* __restrict__ weight,
                                  const float* __restrict__ bias, int dim, float eps) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const T* x = in + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += to_float(x[i]);
  const float mean = block_sum(sum, scratch) / static_cast<float>(dim);
  float sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = to_float(x[i]) - mean;
    sq += d * d;
  }
  // Every thread has read its values before any writes them (out may be in): block_sum syncs.
  const float var = block_sum(sq, scratch) / static_cast<float>(dim);
  const float inv = rsqrtf(var + eps);
  T* y = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    y[i] = from_float<T>((to_float(x[i]) - mean) * inv * weight[i] + bias[i]);
  }
}

// launch_bias_residual_layer_norm: the residual add of launch_bias_act (kNone), then
// layer_norm_kernel's statistics over the stored row, in the same order of sums.
template <typename T>
__global__ void bias_residual_layer_norm_kernel(T* x, const T* delta,
                                                const float* __restrict__ bias, T* normed,
                                                const float* __restrict__ weight,
                                                const float* __restrict__ norm_bias, int dim,
                                                float eps) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  T* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const T* d = delta + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_float(from_float<T>(to_float(d[i]) + bias[i]));
    const T stored = from_float<T>(v + to_float(xr[i]));
    xr[i] = stored;
    sum += to_float(stored);
  }
  const float mean = block_sum(sum, scratch) / static_cast<float>(dim);
  float sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float c = to_float(xr[i]) - mean;  // this thread's own store above
    sq += c * c;
  }
  // Every thread has read its delta before any writes normed (which may be delta): block_sum
  // syncs.
  const float var = block_sum(sq, scratch) / static_cast<float>(dim);
  const float inv = rsqrtf(var + eps);
  T* y = normed + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    y[i] = from_float<T>((to_float(xr[i]) - mean) * inv * weight[i] + norm_bias[i]);
  }
}

template <typename T, VisionActivation kAct>
__global__ void bias_act_kernel(T* out, const T* x, const float* __restrict__ bias,
                                const T* residual, int64_t n, int cols) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = to_float(x[i]);
    if (bias != nullptr) v = to_float(from_float<T>(v + bias[i % cols]));
    if constexpr (kAct == VisionActivation::kQuickGelu) {
      v = to_float(from_float<T>(v / (1.0f + expf(-1.702f * v))));
    } else if constexpr (kAct == VisionActivation::kGeluErf) {
      v = to_float(from_float<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f))));
    }
    if (residual != nullptr) v += to_float(residual[i]);
    out[i] = from_float<T>(v);
  }
}

template <typename T>
__global__ void add_class_position_kernel(T* __restrict__ x, const float* __restrict__ cls,
                                          const float* __restrict__ pos, int hidden) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  T* r = x + row * hidden;
  const float* p = pos + row * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float base = row == 0 ? to_float(from_float<T>(cls[i])) : to_float(r[i]);
    r[i] = from_float<T>(base + p[i]);
  }
}

// probs[r] = softmax(scale * scores[r]) over n columns; one block per row.
template <typename T>
__global__ void softmax_rows_kernel(T* __restrict__ probs, const float* __restrict__ scores, int n,
                                    float scale) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const float* s = scores + static_cast<int64_t>(blockIdx.x) * n;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j] * scale);
  m = block_max(m, scratch);
  float total = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) total += expf(s[j] * scale - m);
  const float inv = 1.0f / block_sum(total, scratch);
  T* p = probs + static_cast<int64_t>(blockIdx.x) * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    p[j] = from_float<T>(expf(s[j] * scale - m) * inv);
}

#if !LITELLAMA_HAVE_CUBLAS
// Portable builds: one block per (query, head). Scores into the float workspace, the softmax's
// probabilities over them in place, then one output dimension per thread.
template <typename T>
__global__ void dense_attention_kernel(T* __restrict__ out, const T* __restrict__ qkv,
                                       float* __restrict__ scores, int n, int n_heads, int hd,
                                       float scale) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t width = static_cast<int64_t>(n_heads) * hd;
  const T* q = qkv + t * 3 * width + h * hd;
  float* s = scores + (static_cast<int64_t>(h) * n + t) * n;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const T* k = qkv + j * 3 * width + width + h * hd;
    float dot = 0.0f;
    for (int i = 0; i < hd; ++i) dot += to_float(q[i]) * to_float(k[i]);
    s[j] = dot * scale;
    m = fmaxf(m, s[j]);
  }
  m = block_max(m, scratch);
  float total = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    s[j] = expf(s[j] - m);
    total += s[j];
  }
  const float inv = 1.0f / block_sum(total, scratch);  // syncs: every s[j] is written
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += s[j] * to_float(qkv[j * 3 * width + 2 * width + h * hd + i]);
    out[t * width + h * hd + i] = from_float<T>(acc * inv);
  }
}
#endif

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

}  // namespace

bool vision_ops_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_layer_norm(void* out, const void* in, const float* weight, const float* bias,
                         int32_t n_rows, int32_t dim, float eps, DType dtype, KernelStream stream) {
  if (n_rows == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "layer_norm", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(layer_norm_kernel<T>, dim3(n_rows), dim3(kRowThreads), 0, stream,
                      static_cast<T*>(out), static_cast<const T*>(in), weight, bias, dim, eps));
    return Status::ok();
  });
}

Status launch_bias_residual_layer_norm(void* x, const void* delta, const float* bias, void* normed,
                                       const float* weight, const float* norm_bias, int32_t n_rows,
                                       int32_t dim, float eps, DType dtype, KernelStream stream) {
  if (n_rows == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "bias_residual_layer_norm", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(bias_residual_layer_norm_kernel<T>, dim3(n_rows), dim3(kRowThreads), 0,
                      stream, static_cast<T*>(x), static_cast<const T*>(delta), bias,
                      static_cast<T*>(normed), weight, norm_bias, dim, eps));
    return Status::ok();
  });
}

Status launch_bias_act(void* out, const void* x, const float* bias, const void* residual,
                       int32_t n_rows, int32_t cols, VisionActivation act, DType dtype,
                       KernelStream stream) {
  const int64_t n = static_cast<int64_t>(n_rows) * cols;
  if (n == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "bias_act", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int threads = 256;
    const auto blocks =
        static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, threads), 65536));
    auto run = [&](auto kernel) {
      return launch_kernel(kernel, dim3(blocks), dim3(threads), 0, stream, static_cast<T*>(out),
                           static_cast<const T*>(x), bias, static_cast<const T*>(residual), n,
                           cols);
    };
    switch (act) {
      case VisionActivation::kNone:
        LITELLAMA_CUDA_RETURN_IF_ERROR(run(bias_act_kernel<T, VisionActivation::kNone>));
        break;
      case VisionActivation::kQuickGelu:
        LITELLAMA_CUDA_RETURN_IF_ERROR(run(bias_act_kernel<T, VisionActivation::kQuickGelu>));
        break;
      case VisionActivation::kGeluErf:
        LITELLAMA_CUDA_RETURN_IF_ERROR(run(bias_act_kernel<T, VisionActivation::kGeluErf>));
        break;
    }
    return Status::ok();
  });
}

Status launch_add_class_position(void* x, const float* class_embedding,
                                 const float* position_embedding, int32_t n_positions,
                                 int32_t hidden, DType dtype, KernelStream stream) {
  if (n_positions == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "add_class_position", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(add_class_position_kernel<T>, dim3(n_positions),
                                                 dim3(kRowThreads), 0, stream, static_cast<T*>(x),
                                                 class_embedding, position_embedding, hidden));
    return Status::ok();
  });
}

size_t dense_attention_workspace_bytes(int32_t n_tokens, int32_t n_heads, DType dtype) {
  const size_t n = static_cast<size_t>(n_heads) * n_tokens * n_tokens;
  return align256(n * sizeof(float)) + align256(n * dtype_size_bytes(dtype));
}

Status launch_dense_attention(void* out, const void* qkv, void* workspace, int32_t n_tokens,
                              int32_t n_heads, int32_t head_dim, DType dtype, LinearHandle handle,
                              KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  auto* scores = static_cast<float*>(workspace);
#if LITELLAMA_HAVE_CUBLAS
  const size_t n_scores = static_cast<size_t>(n_heads) * n_tokens * n_tokens;
  void* probs = static_cast<char*>(workspace) + align256(n_scores * sizeof(float));
  const int64_t width = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t ld = 3 * width;
  const cudaDataType_t type = dtype == DType::kF32    ? CUDA_R_32F
                              : dtype == DType::kBF16 ? CUDA_R_16BF
                                                      : CUDA_R_16F;
  if (!vision_ops_supports(dtype)) {
    return make_error(StatusCode::kUnsupported, "dense_attention: unsupported dtype {}",
                      dtype_torch_name(dtype));
  }
  const cublasComputeType_t compute =
      dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, zero = 0.0f;
  const auto* base = static_cast<const char*>(qkv);
  const size_t elem = dtype_size_bytes(dtype);
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream.stream));
  // Row-major S_h[t, j] = q_h[t] . k_h[j] is column-major S_h^T = K_h^T' Q_h' where the primes
  // are the row-major [n, hd] blocks read as column-major [hd, n] (leading dimension 3 * width):
  // C (n x n, ld n) = op_T(K') (n x hd) * Q' (hd x n). One GEMM per head, strided by head_dim.
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, n_tokens, n_tokens, head_dim, &one,
      base + static_cast<size_t>(width) * elem, type, ld, head_dim, base, type, ld, head_dim, &zero,
      scores, CUDA_R_32F, n_tokens, static_cast<int64_t>(n_tokens) * n_tokens, n_heads, compute,
      CUBLAS_GEMM_DEFAULT));
  LITELLAMA_RETURN_IF_ERROR(dispatch_float_dtype(dtype, "softmax_rows", [&](auto t) -> Status {
    using T = typename decltype(t)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
        softmax_rows_kernel<T>, dim3(static_cast<unsigned>(n_heads) * n_tokens), dim3(kRowThreads),
        0, stream, static_cast<T*>(probs), scores, n_tokens, scale));
    return Status::ok();
  }));
  // Row-major O_h = P_h V_h is column-major O_h' (hd x n, ld width) = V_h' (hd x n, ld 3 width)
  // * P_h^T where the row-major P_h read column-major is P_h^T (n x n, ld n).
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, head_dim, n_tokens, n_tokens, &one,
      base + static_cast<size_t>(2 * width) * elem, type, ld, head_dim, probs, type, n_tokens,
      static_cast<int64_t>(n_tokens) * n_tokens, &zero, out, type, width, head_dim, n_heads,
      compute, CUBLAS_GEMM_DEFAULT));
  return Status::ok();
#else
  (void)handle;
  return dispatch_float_dtype(dtype, "dense_attention", [&](auto t) -> Status {
    using T = typename decltype(t)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(dense_attention_kernel<T>, dim3(n_tokens, n_heads),
                                                 dim3(128), 0, stream, static_cast<T*>(out),
                                                 static_cast<const T*>(qkv), scores, n_tokens,
                                                 n_heads, head_dim, scale));
    return Status::ok();
  });
#endif
}

}  // namespace litellama
