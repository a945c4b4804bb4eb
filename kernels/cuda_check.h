// Checks for every GPU runtime (CUDA or HIP, kernels/gpu_runtime.h) and cuBLAS call and every
// kernel launch. A failure is reported with the expression, file and line; library code turns it
// into a Status, and the worker treats a CUDA fault as fatal to the process (it exits non-zero and
// is restarted).
#pragma once

#include <fmt/format.h>

#include "common/status.h"
#include "kernels/gpu_runtime.h"

#if LITELLAMA_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace litellama {

inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  return Status(StatusCode::kInternal,
                fmt::format(fmt::runtime("CUDA error {} ({}) in '{}' at {}:{}"),
                            cudaGetErrorName(err), cudaGetErrorString(err), expr, file, line));
}

#if LITELLAMA_HAVE_CUBLAS
inline Status cublas_status(cublasStatus_t err, const char* expr, const char* file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status(StatusCode::kInternal, fmt::format(fmt::runtime("cuBLAS error {} in '{}' at {}:{}"),
                                                   cublasGetStatusString(err), expr, file, line));
}
#endif

}  // namespace litellama

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define LITELLAMA_CUDA_RETURN_IF_ERROR(expr) \
  LITELLAMA_RETURN_IF_ERROR(::litellama::cuda_status((expr), #expr, __FILE__, __LINE__))
// After a kernel launch: reports launch-configuration errors with the launch's file and line.
#define LITELLAMA_CUDA_CHECK_LAUNCH(what) \
  LITELLAMA_RETURN_IF_ERROR(::litellama::cuda_status(cudaGetLastError(), what, __FILE__, __LINE__))
#if LITELLAMA_HAVE_CUBLAS
#define LITELLAMA_CUBLAS_RETURN_IF_ERROR(expr) \
  LITELLAMA_RETURN_IF_ERROR(::litellama::cublas_status((expr), #expr, __FILE__, __LINE__))
#endif
