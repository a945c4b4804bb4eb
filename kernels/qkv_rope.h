// Everything between the fused QKV GEMM and attention, in one kernel. Replaces the unfused
// sequence
//   q, k, v = split(x @ [W_q; W_k; W_v]^T) (+ [b_q; b_k; b_v])      (Qwen2: bias)
//   q = rmsnorm_per_head(q, q_norm); k = rmsnorm_per_head(k, k_norm)  (Qwen3)
//   q = rope(q, pos); k = rope(k, pos)         rotate-half, cos/sin * attention_scaling
//   k_pool[slot] = k; v_pool[slot] = v         (the token's KV slot from the slot table)
// writing q packed for attention. inv_freq has one row per frequency table in use: row 0 for
// every token unless token_freq_row names another (dynamic NTK gives a sequence past the original
// context its own row). Angles are float32 position * inv_freq, as in the CPU backend.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// True for dtype kF32/kBF16/kF16 and an even head_dim from 2 to 256.
bool qkv_rope_supports(int32_t head_dim, DType dtype);

Status launch_qkv_rope(void* q_out,                 // [n_tokens, n_heads, head_dim]
                       void* k_pool,                // [n_slots, n_kv_heads, head_dim]
                       void* v_pool,                // [n_slots, n_kv_heads, head_dim]
                       const void* qkv,             // [n_tokens, n_heads + 2 n_kv_heads, head_dim]
                       const float* qkv_bias,       // [n_heads + 2 n_kv_heads, head_dim] or nullptr
                       const float* q_norm_weight,  // [head_dim] or nullptr
                       const float* k_norm_weight,  // [head_dim] or nullptr
                       const float* inv_freq,       // [n_freq_rows, head_dim / 2]
                       const int32_t* positions,    // [n_tokens]
                       const int32_t* token_slot,   // [n_tokens] KV slot of each token
                       const int32_t* token_freq_row,  // [n_tokens] or nullptr (all row 0)
                       int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                       float attention_scaling, float norm_eps, DType dtype, KernelStream stream);

}  // namespace litellama
