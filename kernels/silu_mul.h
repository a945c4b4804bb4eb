// SiLU-gated product after the fused gate/up GEMM. Replaces the unfused sequence
//   gate = x @ W_gate^T;  up = x @ W_up^T;  act = silu(gate) * up
// whose two GEMMs are one GEMM over the concatenated [W_gate; W_up], so each row of its output is
// [gate (inter), up (inter)]. Arithmetic in float32, one rounding to the compute dtype.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool silu_mul_supports(DType dtype);

Status launch_silu_mul(void* act,            // [n_tokens, inter]
                       const void* gate_up,  // [n_tokens, 2 * inter]
                       int32_t n_tokens, int32_t inter, DType dtype, KernelStream stream);

// The same with each row of act quantized to e4m3 per row instead of stored (the input of an FP8
// GEMM, kernels/linear_fp8.h): exactly launch_fp8_quantize_rows of the act that launch_silu_mul
// would store. One block per row; bf16 / fp16, inter a multiple of 8; CUDA builds only
// (kUnsupported in portable builds).
Status launch_silu_mul_fp8(uint8_t* q,           // [n_tokens, inter] e4m3 out
                           float* scales,        // [n_tokens] out
                           const void* gate_up,  // [n_tokens, 2 * inter]
                           int32_t n_tokens, int32_t inter, DType dtype, KernelStream stream);

}  // namespace litellama
