// The pointers every attention launcher (attention_decode.h, attention_prefill.h,
// attention_general.h) reads or writes, all device pointers, in StepBatch's batch layout
// (services/worker/model_runner.h): sequence s has kv_len[s] positions after the step, position p
// in slot slot_table[slot_start[s] + p] of the K and V pools; its new tokens
// q[token_start[s] .. token_start[s+1]) are positions kv_len[s]-n_new .. kv_len[s]-1. seq_ids
// lists the n_work sequences a launch processes. The launchers take AttentionTensors<void>; each
// kernel's parameter struct derives from the form typed as its storage type T
// (attention_common.cuh), so the pointers come first and keep their names.
#pragma once

#include <cstdint>

namespace litellama {

template <typename T>
struct AttentionTensors {
  T* out;                      // [n_tokens, n_heads, head_dim]
  const T* q;                  // [n_tokens, n_heads, head_dim]
  const T* k_pool;             // [n_slots, n_kv_heads, head_dim]
  const T* v_pool;             // [n_slots, n_kv_heads, head_dim]
  const int32_t* token_start;  // [n_seqs + 1]
  const int32_t* kv_len;       // [n_seqs]
  const int32_t* slot_start;   // [n_seqs + 1]
  const int32_t* slot_table;   // [sum kv_len]
  const int32_t* seq_ids;      // [n_work]
};

}  // namespace litellama
