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

// The float32 kernels' K/V step (prefill and decode alike): keys key0 .. key0 + kKeys - 1 of KV
// head kvh, gathered through the sequence's slots by the kThreads threads of the CTA, 16 bytes a
// thread at a time. K goes into rows padded by one float (the score loop's lanes read one column
// of different rows); keys at or past key_end are zero in both.
template <int D, int kKeys, int kThreads>
__device__ __forceinline__ void load_kv_step_f32(float (*s_k)[D + 1], float (*s_v)[D],
                                                 const float* k_pool, const float* v_pool,
                                                 const int32_t* slots, int key0, int key_end,
                                                 int n_kv_heads, int kvh) {
  for (int c = threadIdx.x; c < kKeys * D / 4; c += kThreads) {
    const int r = c / (D / 4);
    const int col = (c % (D / 4)) * 4;
    const int pos = key0 + r;
    float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 vv = kv;
    if (pos < key_end) {
      const int64_t off = (static_cast<int64_t>(slots[pos]) * n_kv_heads + kvh) * D + col;
      kv = *reinterpret_cast<const float4*>(k_pool + off);
      vv = *reinterpret_cast<const float4*>(v_pool + off);
    }
    s_k[r][col] = kv.x;
    s_k[r][col + 1] = kv.y;
    s_k[r][col + 2] = kv.z;
    s_k[r][col + 3] = kv.w;
    *reinterpret_cast<float4*>(&s_v[r][col]) = vv;
  }
}

// The dtype and head-count half of every attention supports() predicate: a float compute dtype
// and n_heads a positive multiple of n_kv_heads (whole query groups per KV head).
inline bool attention_shapes_supported(DType dtype, int32_t n_heads, int32_t n_kv_heads) {
  return is_float_compute_dtype(dtype) && n_kv_heads > 0 && n_heads > 0 &&
         n_heads % n_kv_heads == 0;
}

}  // namespace litellama
