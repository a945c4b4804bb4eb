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

}  // namespace litellama
