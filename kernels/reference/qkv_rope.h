// CPU references of the ops kernels/qkv_rope fuses, float32: bias add (reference::add), per-head
// RMSNorm, rotate-half RoPE and the KV store through per-token slots.
#pragma once

#include <cstdint>

namespace litellama::reference {

// Each head of each row normalized over head_dim with a shared weight.
void rmsnorm_per_head(float* x,             // [n_rows, n_heads, head_dim] in/out
                      const float* weight,  // [head_dim]
                      int32_t n_rows, int32_t n_heads, int32_t head_dim, float eps);

// Rotate-half RoPE: for i < head_dim/2, angle = float(pos) * inv_freq[i], c = cos * scaling,
// s = sin * scaling, (x[i], x[i + d/2]) <- (x[i] c - x[i + d/2] s, x[i + d/2] c + x[i] s).
void rope(float* x,                  // [n_rows, n_heads, head_dim] in/out
          const int32_t* positions,  // [n_rows]
          const float* inv_freq,     // [n_rows, head_dim / 2]: each row's own table
          int32_t n_rows, int32_t n_heads, int32_t head_dim, float attention_scaling);

// pool[slots[t]] = x[t]
void store_slots(float* pool,           // [n_slots, row_elems]
                 const float* x,        // [n_rows, row_elems]
                 const int32_t* slots,  // [n_rows]
                 int32_t n_rows, int64_t row_elems);

}  // namespace litellama::reference
