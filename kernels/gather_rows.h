// Row gather: out[i] = in[rows[i]]. Picks the last token of each sampled sequence out of the
// packed step, so the final norm and the lm_head GEMM run on those rows only (logits for sampled
// sequences alone).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool gather_rows_supports(DType dtype);

// rows[i] must be in [0, n_rows_in); the caller builds them on the host.
Status launch_gather_rows(void* out,            // [n_rows_out, cols]
                          const void* in,       // [n_rows_in, cols]
                          const int32_t* rows,  // [n_rows_out]
                          int32_t n_rows_out, int32_t cols, DType dtype, KernelStream stream);

// Row scatter from float32: out[rows[i]] = in[i] rounded to dtype, for i < n_rows_in (input
// embeddings such as LLaVA's image features replacing the embedding lookup of some tokens; `in`
// is read in place, e.g. from a pool another process exports). rows[i] must be in range.
Status launch_scatter_rows_f32(void* out,            // [*, cols] of dtype
                               const float* in,      // [n_rows_in, cols]
                               const int32_t* rows,  // [n_rows_in]
                               int32_t n_rows_in, int32_t cols, DType dtype, KernelStream stream);

}  // namespace litellama
