// y[m, n] = x[m, k] @ w[n, k]^T through cuBLAS or the tiled kernel (kernels/linear.h).
#include "kernels/linear.h"

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {

bool linear_supports(DType dtype, DType out_dtype) {
  switch (dtype) {
    case DType::kF32:
      return out_dtype == DType::kF32;
    case DType::kBF16:
    case DType::kF16:
      return out_dtype == dtype || out_dtype == DType::kF32;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
      break;
  }
  return false;
}

namespace {

constexpr int kTileM = 64;  // rows of x per CTA
constexpr int kTileN = 64;  // rows of w (columns of y) per CTA
constexpr int kTileK = 16;  // k per shared-memory stage
constexpr int kThreads = 256;
constexpr int kSide = 16;  // the CTA's threads as a 16 x 16 grid, 4 x 4 outputs each
constexpr int kPer = kTileM / kSide;
static_assert(kTileM == kTileN && kSide * kSide == kThreads && kTileM * kTileK == 4 * kThreads);

// Loads rows [row0, row0 + 64) x [k0, k0 + 16) of a [rows, k] matrix into tile[kk][r] as float32,
// zero outside the matrix. Thread t loads row t / 4, 4 consecutive k from (t % 4) * 4.
template <typename T>
__device__ __forceinline__ void load_tile(float (&tile)[kTileK][kTileM + 1], const T* a,
                                          int64_t rows, int32_t k, int64_t row0, int32_t k0) {
  const int r = static_cast<int>(threadIdx.x) / 4;
  const int kk = (static_cast<int>(threadIdx.x) % 4) * 4;
  const int64_t row = row0 + r;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int32_t col = k0 + kk + j;
    tile[kk + j][r] = row < rows && col < k ? to_float(a[row * k + col]) : 0.0f;
  }
}

// Grid (ceil(n / 64), ceil(m / 64)); thread (ty, tx) computes rows ty + 16 i and columns
// tx + 16 j of the CTA's tile, so a warp's reads of the w tile are consecutive.
template <typename T, typename Out>
__global__ void __launch_bounds__(kThreads)
    linear_tiled_kernel(Out* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                        int32_t m, int32_t n, int32_t k) {
  __shared__ float xs[kTileK][kTileM + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const int tx = static_cast<int>(threadIdx.x) % kSide;
  const int ty = static_cast<int>(threadIdx.x) / kSide;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  float acc[kPer][kPer] = {};
  for (int32_t k0 = 0; k0 < k; k0 += kTileK) {
    load_tile(xs, x, m, k, row0, k0);
    load_tile(ws, w, n, k, col0, k0);
    __syncthreads();
    float part[kPer][kPer] = {};
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kPer], b[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) a[i] = xs[kk][ty + kSide * i];
#pragma unroll
      for (int j = 0; j < kPer; ++j) b[j] = ws[kk][tx + kSide * j];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[i][j] += part[i][j];
    }
    __syncthreads();  // the tiles are rewritten by the next stage
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = row0 + ty + kSide * i;
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t col = col0 + tx + kSide * j;
      if (col < n) y[row * n + col] = from_float<Out>(acc[i][j]);
    }
  }
}

}  // namespace

Status launch_linear_tiled(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                           DType dtype, DType out_dtype, KernelStream stream) {
  if (!linear_supports(dtype, out_dtype)) {
    return make_error(StatusCode::kUnsupported, "linear: unsupported dtypes {} -> {}",
                      dtype_torch_name(dtype), dtype_torch_name(out_dtype));
  }
  if (m == 0 || n == 0) return Status::ok();
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(n, kTileN)),
                  static_cast<unsigned>(ceil_div<int64_t>(m, kTileM)));
  // The kernel has no pdl_wait() (it reads activations from its first instruction), so it is
  // launched without the PDL attribute.
  const KernelStream plain(stream.stream);
  return dispatch_float_dtype(dtype, "linear", [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    if (out_dtype == DType::kF32) {
      LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
          linear_tiled_kernel<T, float>, grid, dim3(kThreads), 0, plain, static_cast<float*>(y),
          static_cast<const T*>(x), static_cast<const T*>(w), m, n, k));
    } else {
      LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
          linear_tiled_kernel<T, T>, grid, dim3(kThreads), 0, plain, static_cast<T*>(y),
          static_cast<const T*>(x), static_cast<const T*>(w), m, n, k));
    }
    return Status::ok();
  });
}

#if LITELLAMA_HAVE_CUBLAS
// cuBLAS is column-major: the row-major y is the column-major y^T[n, m] = w^T-as-stored (op T
// over the column-major [k, n] view of w) times x^T[k, m].
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
      break;
  }
  return CUDA_R_32F;
}

}  // namespace

Status linear_handle_create(LinearHandle* handle) {
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasCreate(handle));
  return Status::ok();
}

void linear_handle_destroy(LinearHandle handle) {
  if (handle != nullptr) (void)cublasDestroy(handle);
}

Status linear_handle_set_workspace(LinearHandle handle, void* workspace, size_t bytes) {
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(handle, workspace, bytes));
  return Status::ok();
}

const char* linear_backend_name() {
  return "cuBLAS";
}

Status launch_linear(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                     DType dtype, DType out_dtype, LinearHandle handle, KernelStream stream) {
  if (!linear_supports(dtype, out_dtype)) {
    return make_error(StatusCode::kUnsupported, "linear: unsupported dtypes {} -> {}",
                      dtype_torch_name(dtype), dtype_torch_name(out_dtype));
  }
  if (m == 0) return Status::ok();
  const float alpha = 1.0f, beta = 0.0f;
  const cublasComputeType_t compute =
      dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream.stream));
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, cuda_type(dtype), k, x,
      cuda_type(dtype), k, &beta, y, cuda_type(out_dtype), n, compute, CUBLAS_GEMM_DEFAULT));
  return Status::ok();
}

#else  // the portable builds: the tiled kernel

Status linear_handle_create(LinearHandle* handle) {
  *handle = nullptr;
  return Status::ok();
}

void linear_handle_destroy(LinearHandle /*handle*/) {}

Status linear_handle_set_workspace(LinearHandle /*handle*/, void* /*workspace*/, size_t /*bytes*/) {
  return Status::ok();
}

const char* linear_backend_name() {
  return "portable";
}

Status launch_linear(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                     DType dtype, DType out_dtype, LinearHandle /*handle*/, KernelStream stream) {
  return launch_linear_tiled(y, x, w, m, n, k, dtype, out_dtype, stream);
}

#endif

}  // namespace litellama
