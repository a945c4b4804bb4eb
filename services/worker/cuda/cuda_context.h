// The CUDA runner's per-process device state: its step stream, the linear layers' library handle
// and the events that time a step.
#pragma once

#include "common/status.h"
#include "kernels/cuda_check.h"
#include "kernels/gpu_runtime.h"
#include "kernels/linear.h"

namespace litellama {

// Owns a stream, a cuBLAS handle and the two events that time a step on the device; destroyed in
// reverse order of creation.
class CudaContext {
 public:
  CudaContext() = default;
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
  ~CudaContext() {
    if (step_end_ != nullptr) (void)cudaEventDestroy(step_end_);
    if (step_start_ != nullptr) (void)cudaEventDestroy(step_start_);
    linear_handle_destroy(linear_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Status init() {
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LITELLAMA_RETURN_IF_ERROR(linear_handle_create(&linear_));
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_start_));
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_end_));
    return Status::ok();
  }
  cudaStream_t stream() const { return stream_; }
  LinearHandle linear() const { return linear_; }
  cudaEvent_t step_start() const { return step_start_; }
  cudaEvent_t step_end() const { return step_end_; }

 private:
  cudaStream_t stream_ = nullptr;
  LinearHandle linear_ = nullptr;
  cudaEvent_t step_start_ = nullptr;
  cudaEvent_t step_end_ = nullptr;
};

}  // namespace litellama
