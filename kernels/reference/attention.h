// CPU reference of causal attention over the token-attention KV pool: the oracle of the prefill
// and decode kernels' tests. Same slot-table contract as the kernels (services/worker/
// model_runner.h): sequence s has kv_len[s] tokens after the step, position p in slot
// slot_table[slot_start[s] + p]; its new tokens q[token_start[s] .. token_start[s+1]) are the
// last positions, and the token at position p attends to positions 0..p. GQA: query head h reads
// KV head h / (n_heads / n_kv_heads). Inputs are float (the caller rounds them to the compute
// dtype first, so only the kernels' arithmetic differs); dot products, softmax and the weighted
// sum run in double.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"

namespace litellama {

// Writes out rows of the sequences listed in seq_ids only; other rows are left untouched.
// Validates sizes, offsets and slots (against n_slots) first; on error nothing was written.
Status attention_reference(float* out,                            // [n_tokens, n_heads, head_dim]
                           const float* q,                        // [n_tokens, n_heads, head_dim]
                           const float* k_pool,                   // [n_slots, n_kv_heads, head_dim]
                           const float* v_pool,                   // [n_slots, n_kv_heads, head_dim]
                           std::span<const int32_t> token_start,  // [n_seqs + 1]
                           std::span<const int32_t> kv_len,       // [n_seqs]
                           std::span<const int32_t> slot_start,   // [n_seqs + 1]
                           std::span<const int32_t> slot_table,   // [sum kv_len]
                           std::span<const int32_t> seq_ids,      // [n_work]
                           int32_t n_slots, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                           float scale);

}  // namespace litellama
