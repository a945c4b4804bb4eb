// Causal attention over the token-attention KV pool for any head size up to 256 and any GQA group:
// the path for shapes the tuned kernels (attention_prefill.h, attention_decode.h: head_dim 64 and
// 128) do not take, so that the CUDA backend runs every model the CPU backend runs. Correctness
// first: one CTA per (sequence, new token, query head), its warps take the keys in turn with an
// online softmax in float32 and merge in shared memory. Slower than the tuned kernels (no tensor
// cores, K/V read once per query head instead of once per group), the same arithmetic for every
// dtype: float32 products and sums of values upcast from the pool.
//
// The batch layout is StepBatch's (services/worker/model_runner.h): sequence s has kv_len[s]
// positions after the step, position p in slot slot_table[slot_start[s] + p]; its new tokens
// q[token_start[s] .. token_start[s+1]) are positions kv_len[s]-n_new .. kv_len[s]-1 and attend
// to every position up to their own. Decode tokens are sequences with n_new == 1.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/attention_tensors.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// The largest head size the general path takes (8 float32 values per lane of a warp).
inline constexpr int32_t kAttentionGeneralMaxHeadDim = 256;

// True for dtype kF32/kBF16/kF16, 1 <= head_dim <= 256 and n_heads a positive multiple of
// n_kv_heads.
bool attention_general_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads);

// Processes the n_work sequences listed in tensors.seq_ids and writes exactly their rows of `out`.
// max_n_new only sizes the grid (CTAs loop over the new tokens they are given): any value >= 1 is
// correct. Launched with programmatic dependent launch where enabled; it waits before reading
// anything.
Status launch_attention_general(const AttentionTensors<void>& tensors, int32_t n_work,
                                int32_t max_n_new, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, DType dtype, float scale, KernelStream stream);

}  // namespace litellama
