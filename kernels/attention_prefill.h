// Varlen packed causal attention over the token-attention KV pool (FlashAttention-2 style), for
// prefill chunks and any sequence with n_new >= 1. Sequence s has kv_len[s] tokens after the step;
// position p lives in slot slot_table[slot_start[s] + p] of the K and V pools; its n_new new tokens
// q[token_start[s] .. token_start[s+1]) are positions kv_len[s]-n_new .. kv_len[s]-1 (their K/V
// already written to the pool), and the token at position p attends to positions 0..p, cached
// prefix included. GQA: query head h reads KV head h / (n_heads / n_kv_heads); KV is never
// repeated in memory: one CTA packs the rows (token, query head) of one KV head's group, so a K/V
// tile gathered into shared memory serves the whole group.
// bf16/fp16 run on tensor cores (mma.sync m16n8k16, fp32 accumulation and online softmax);
// float32 runs an exact fp32 SIMT path (no TF32) for verification against fp32 references.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/attention_tensors.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// True for dtype kF32/kBF16/kF16, 1 <= head_dim <= 256 and n_heads a positive multiple of
// n_kv_heads. Head sizes other than the tuned ones run the general path (attention_general.h).
bool attention_prefill_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads);

// Whether head_dim takes the tuned kernels of this file (64 and 128).
bool attention_prefill_tuned(int32_t head_dim);

// Processes the n_work sequences listed in tensors.seq_ids (any order, each at most once) and
// writes exactly their rows of `out`; rows of other sequences are untouched. max_n_new only sizes
// the grid: any value
// >= 1 is correct (CTAs loop over the query tiles they are given); the largest n_new of the listed
// sequences makes the most parallel launch. All pointers are device pointers; the int32 arrays are
// those of StepBatch. Returns kUnsupported when attention_prefill_supports() is false.
Status launch_attention_prefill(const AttentionTensors<void>& tensors, int32_t n_work,
                                int32_t max_n_new, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, DType dtype, float scale, KernelStream stream);

}  // namespace litellama
