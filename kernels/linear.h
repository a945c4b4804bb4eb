// Linear layer y = x @ w^T (row-major x and w as in Hugging Face checkpoints), float32
// accumulation, output in the input dtype or float32 (the lm_head writes float32 logits).
//
// Two implementations behind one launcher:
//   - cuBLAS (CUDA builds): bf16 and fp16 on tensor cores; float32 runs
//     CUBLAS_COMPUTE_32F_PEDANTIC, which never uses TF32, so the float32 path matches the CPU
//     backend to float32 rounding;
//   - a tiled kernel (launch_linear_tiled, in every GPU build; launch_linear's only path with
//     LITELLAMA_PORTABLE_KERNELS, every HIP build: Debian's ROCm has no hipBLAS or rocBLAS): 64x64
//     output tiles through shared memory, float32 fused multiply-adds, each 16-wide k slice summed
//     on its own before it joins the total (which keeps float32 sums over k = 4096 within the
//     1e-6 relative error CudaKernels.Linear asks of cuBLAS). Every output element is summed in
//     the same order whatever m is and wherever its row sits in the batch, so its result does not
//     depend on the batch: the CUDA runner's float32 path relies on that (cuBLAS picks its
//     kernels, and with them the order of the sums, by the shape). Written for correctness
//     first; its speed on AMD GPUs has not been measured.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

#if LITELLAMA_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace litellama {

// The library state the linear layers run with: a cuBLAS handle where cuBLAS runs them, nothing
// (null) for the portable kernel.
#if LITELLAMA_HAVE_CUBLAS
using LinearHandle = cublasHandle_t;
#else
using LinearHandle = void*;
#endif

Status linear_handle_create(LinearHandle* handle);
void linear_handle_destroy(LinearHandle handle);
// Gives the handle `bytes` of device workspace that stays the caller's (cublasSetWorkspace, so
// that a CUDA graph capture allocates nothing); the portable kernel needs none.
Status linear_handle_set_workspace(LinearHandle handle, void* workspace, size_t bytes);

// Which implementation launch_linear runs in this build, for logs: "cuBLAS" or "portable".
const char* linear_backend_name();

bool linear_supports(DType dtype, DType out_dtype);

// The tiled kernel in any build (see above): batch-invariant sums, no library handle.
Status launch_linear_tiled(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                           DType dtype, DType out_dtype, KernelStream stream);

// The stream is set on the handle for this call.
Status launch_linear(void* y,        // [m, n] of out_dtype
                     const void* x,  // [m, k] of dtype
                     const void* w,  // [n, k] of dtype
                     int32_t m, int32_t n, int32_t k, DType dtype, DType out_dtype,
                     LinearHandle handle, KernelStream stream);

}  // namespace litellama
