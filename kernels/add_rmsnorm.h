// Fused residual add + RMSNorm. Replaces the unfused sequence
//   residual = residual + delta;                        (add)
//   normed = residual * rsqrt(mean(residual^2) + eps) * weight   (rmsnorm)
// with one pass: the updated residual (rounded to the compute dtype, as the unfused add stores it)
// is written back and normalized, all arithmetic in float32. With delta == nullptr it is a plain
// RMSNorm of `residual` (the first layer, whose residual is the embedding).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool add_rmsnorm_supports(DType dtype);

// Programmatic dependent launch (kernels/launch.h): by default the kernel lets the next one launch
// as it starts. With dependents_after_input, it does so only once its own input is complete (after
// its griddepcontrol.wait), so a large next grid does not start its weight loads while the kernel
// before this one still runs. `weight` is read before that wait (launch.h's rule for weights), so
// no kernel may write it.
Status launch_add_rmsnorm(void* normed,         // [n_rows, hidden] out
                          void* residual,       // [n_rows, hidden] in/out
                          const void* delta,    // [n_rows, hidden] or nullptr
                          const float* weight,  // [hidden]
                          int32_t n_rows, int32_t hidden, float eps, DType dtype,
                          KernelStream stream, bool dependents_after_input = false);

// The same with the normalized rows quantized to e4m3 per row instead of stored (the input of an
// FP8 GEMM, kernels/linear_fp8.h): q and scales are exactly launch_fp8_quantize_rows of the
// `normed` that launch_add_rmsnorm would store. bf16 / fp16, hidden a multiple of 8; CUDA builds
// only (kUnsupported in portable builds).
Status launch_add_rmsnorm_fp8(uint8_t* q,           // [n_rows, hidden] e4m3 out
                              float* scales,        // [n_rows] out
                              void* residual,       // [n_rows, hidden] in/out
                              const void* delta,    // [n_rows, hidden] or nullptr
                              const float* weight,  // [hidden]
                              int32_t n_rows, int32_t hidden, float eps, DType dtype,
                              KernelStream stream);

}  // namespace litellama
