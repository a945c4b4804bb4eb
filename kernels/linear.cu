// y[m, n] = x[m, k] @ w[n, k]^T. cuBLAS is column-major: the row-major y is the column-major
// y^T[n, m] = w^T-as-stored (op T over the column-major [k, n] view of w) times x^T[k, m].
#include "kernels/linear.h"

#include "kernels/cuda_check.h"

namespace litellama {
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
      break;
  }
  return CUDA_R_32F;
}

}  // namespace

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
      break;
  }
  return false;
}

Status launch_linear(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                     DType dtype, DType out_dtype, cublasHandle_t handle, KernelStream stream) {
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

}  // namespace litellama
