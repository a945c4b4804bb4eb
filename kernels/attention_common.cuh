// What the three attention kernels over the token-attention KV pool (attention_decode.cu,
// attention_prefill.cu, attention_general.cu) share: the batch description their launchers take,
// its typed form that heads each kernel's parameter struct, and the shape check of their supports()
// predicates. Included by .cu files only.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/kernel_common.cuh"
#include "kernels/kernel_stream.h"

namespace litellama {

// The pointers every attention kernel reads or writes, typed as the kernel's storage type T
// (void for the general kernel, which casts per dtype inside). A kernel's parameter struct
// derives from this one, so the pointers come first and keep their names.
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

// A launcher's arguments as one value, passed from the public launcher to the typed launch.
struct AttentionArgs {
  AttentionTensors<void> tensors;
  int32_t n_work;
  int32_t n_heads;
  int32_t n_kv_heads;
  float scale;  // softmax scale (natural base)
  KernelStream stream;
};

template <typename T>
AttentionTensors<T> typed_tensors(const AttentionTensors<void>& t) {
  return AttentionTensors<T>{static_cast<T*>(t.out),
                             static_cast<const T*>(t.q),
                             static_cast<const T*>(t.k_pool),
                             static_cast<const T*>(t.v_pool),
                             t.token_start,
                             t.kv_len,
                             t.slot_start,
                             t.slot_table,
                             t.seq_ids};
}

// The dtype and head-count half of every attention supports() predicate: a float compute dtype
// and n_heads a positive multiple of n_kv_heads (whole query groups per KV head).
inline bool attention_shapes_supported(DType dtype, int32_t n_heads, int32_t n_kv_heads) {
  return is_float_compute_dtype(dtype) && n_kv_heads > 0 && n_heads > 0 &&
         n_heads % n_kv_heads == 0;
}

}  // namespace litellama
