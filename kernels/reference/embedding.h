// CPU reference of kernels/embedding: out[t] = table[token_ids[t]], float32.
#pragma once

#include <cstdint>

namespace litellama::reference {

void embedding(float* out,                // [n_tokens, hidden]
               const int32_t* token_ids,  // [n_tokens]
               const float* table,        // [vocab_size, hidden]
               int32_t n_tokens, int32_t hidden);

}  // namespace litellama::reference
