// Split-K decode attention (FlashDecoding) over the token-attention KV pool, for sequences with
// exactly one new token (n_new == 1: the query is token token_start[s] at position kv_len[s]-1 and
// attends to all kv_len[s] positions through the slot table; see services/worker/model_runner.h).
// One CTA handles one (sequence, KV head, split of the key range) and computes all query heads of
// that KV head's group (up to 16 per CTA), so each KV head's K/V rows are read once for the whole
// group; the splits merge with a log-sum-exp weighted sum, inside the same launch where the
// splits of a group fit one thread-block cluster (bf16/fp16, compute capability 9.0+, up to 8
// splits), otherwise in a second small kernel over a workspace. bf16/fp16 use
// tensor cores (mma.sync m16n8k16, the group's heads as the 16 rows), fp32 accumulation and
// softmax; float32 runs an exact fp32 SIMT path (no TF32).
//
// Split plan: the number of splits is a launch-time choice from (n_work, n_kv_heads, max_kv_len,
// n_sms) so that the grid fills the GPU; each CTA divides its own sequence's kv_len on the device,
// so results are correct for any kv_len (max_kv_len is only a hint: a CUDA graph captured with one
// value stays correct as sequences grow).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/attention_tensors.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// True for dtype kF32/kBF16/kF16, 1 <= head_dim <= 256 and n_heads a positive multiple of
// n_kv_heads. Head sizes other than the tuned ones run the general path (attention_general.h),
// which plans no splits and needs no workspace.
bool attention_decode_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads);

// Whether head_dim takes the tuned kernels of this file (64 and 128).
bool attention_decode_tuned(int32_t head_dim);

// The split plan per (sequence, KV head) for these arguments (1 means no merge and no workspace
// use); launch_attention_decode runs attention_decode_launch_splits of it. Under one wave of CTAs
// it splits for parallelism; above, only against a badly filled last wave. n_sms: the device's
// multiprocessor count, read once by the caller (cudaDevAttrMultiProcessorCount).
int32_t attention_decode_n_splits(int32_t n_work, int32_t n_heads, int32_t n_kv_heads,
                                  int32_t head_dim, int32_t max_kv_len, int32_t n_sms);

// The splits launch_attention_decode launches for a plan of n_splits on the current device: a plan
// just past a cluster's worth (9 to 16) becomes one cluster of 8, each CTA taking up to two key
// tiles, where clusters merge for this dtype; otherwise the plan itself.
int32_t attention_decode_launch_splits(int32_t n_splits, DType dtype);

// Whether launch_attention_decode merges n_splits splits inside one clustered launch on the
// current device (no merge kernel, no workspace use) for this dtype.
bool attention_decode_merges_in_cluster(int32_t n_splits, DType dtype);

// Workspace bytes enough for every call with n_work <= max_n_work and max_kv_len <= max_kv_len
// (and the same heads, head_dim and n_sms), so one allocation can serve all steps (and graphs).
size_t attention_decode_workspace_size_bytes(int32_t max_n_work, int32_t n_heads,
                                             int32_t n_kv_heads, int32_t head_dim,
                                             int32_t max_kv_len, int32_t n_sms);

// Processes the n_work sequences listed in tensors.seq_ids (each must have n_new == 1) and writes
// exactly their rows of `out`; rows of other sequences are untouched. workspace: 16-byte aligned
// device memory, attention_decode_workspace_size_bytes(n_work, ...) bytes for the full split plan;
// with less (or none) a plan that merges through the workspace uses as many splits as fit, down to
// one, which needs no workspace: slower, same result. Returns kUnsupported when
// attention_decode_supports() is false.
//
// With programmatic dependent launch (kernels/launch.h) and up to 8 sequences, the bf16/fp16
// kernel starts loading its first K/V tiles before it waits for the previous kernel, so that the
// loads overlap the QKV projection (larger batches keep the plain order). For that, no K/V row
// this launch reads other than each sequence's newest key (kv_len - 1) may be written by a kernel
// that can still be running (one after the last operation in the stream launched without the PDL
// attribute, such as a copy), and the sequence metadata and the slot table must be written before
// that operation. In a model step: slots hold one token each, and the step's arrays arrive by a
// copy before its first kernel.
Status launch_attention_decode(const AttentionTensors<void>& tensors, int32_t n_work,
                               int32_t max_kv_len, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, DType dtype, float scale, int32_t n_sms,
                               void* workspace, size_t workspace_bytes, KernelStream stream);

}  // namespace litellama
