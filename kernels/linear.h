// Linear layer y = x @ w^T through cuBLAS (row-major x and w as in Hugging Face checkpoints). bf16
// and fp16 take tensor cores with float32 accumulation; float32 runs CUBLAS_COMPUTE_32F_PEDANTIC,
// which never uses TF32, so the float32 path matches the CPU backend to float32 rounding.
// The output may be float32 for 16-bit inputs (the lm_head writes float32 logits).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool linear_supports(DType dtype, DType out_dtype);

// The handle's workspace (cublasSetWorkspace) is the caller's; the stream is set on the handle for
// this call.
Status launch_linear(void* y,        // [m, n] of out_dtype
                     const void* x,  // [m, k] of dtype
                     const void* w,  // [n, k] of dtype
                     int32_t m, int32_t n, int32_t k, DType dtype, DType out_dtype,
                     cublasHandle_t handle, KernelStream stream);

}  // namespace litellama
