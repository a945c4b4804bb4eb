// Token embedding gather: out[t] = table[token_ids[t]], in the compute dtype. The first op of a
// step; the result is the first layer's residual stream.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool embedding_supports(DType dtype);

// Ids must be in [0, vocab_size) (StepBatch::validate checks them on the host).
Status launch_embedding(void* out,                 // [n_tokens, hidden]
                        const int32_t* token_ids,  // [n_tokens]
                        const void* table,         // [vocab_size, hidden]
                        int32_t n_tokens, int32_t hidden, DType dtype, KernelStream stream);

}  // namespace litellama
