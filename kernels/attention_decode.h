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

// ---- shared-prefix (cascade) decode ----
//
// Decode sequences whose tables begin with the same slots (a prefix the scheduler's cache gives
// them) read those keys once for all of them: a task covers one key range of one table for the
// query heads of up to attention_decode_cascade_members() sequences whose tables agree over that
// range (their rows fill the tensor-core tile the group's heads leave empty), writes each
// member's partial result (normalized output and log-sum-exp) to a part row of the workspace, and
// a merge kernel combines each sequence's parts. services/worker/cuda/step_staging.cpp plans the
// tasks on the host. The result equals the plain launch's within rounding (the sums over keys
// are split differently).

// Fields of one task, kDecodeTaskFields int32 each.
inline constexpr int32_t kTaskMemberBegin = 0;  // first entry of `members`
inline constexpr int32_t kTaskMembers = 1;      // entries (sequences) of the task
inline constexpr int32_t kTaskTableSeq = 2;     // sequence whose table holds the keys
inline constexpr int32_t kTaskKeyBegin = 3;     // keys key_begin .. key_end - 1
inline constexpr int32_t kTaskKeyEnd = 4;
inline constexpr int32_t kDecodeTaskFields = 5;

struct DecodeCascade {
  const int32_t* n_tasks = nullptr;     // device: how many tasks the arrays hold
  const int32_t* tasks = nullptr;       // device [max_tasks][kDecodeTaskFields]
  const int32_t* members = nullptr;     // device pairs (sequence id, part index)
  const int32_t* part_start = nullptr;  // device [n_work + 1]: work item w's parts
  int32_t max_tasks = 0;                // the grid: CTAs past *n_tasks return at once
  int32_t max_parts = 0;                // part rows the workspace must hold, per head
};

// Sequences one task may cover (64 rows over the heads of a KV group), or 0 where the cascade does
// not run: float32, untuned head sizes, groups of more than 8 heads, portable builds.
int32_t attention_decode_cascade_members(DType dtype, int32_t head_dim, int32_t n_heads,
                                         int32_t n_kv_heads);

// Workspace bytes of a cascade with max_parts part rows per head.
size_t attention_decode_cascade_workspace_bytes(int32_t max_parts, int32_t n_heads,
                                                int32_t head_dim);

// Runs the cascade's tasks over the n_work sequences of tensors.seq_ids (each n_new == 1; part
// rows of work item w are cascade.part_start[w] .. [w + 1] - 1), then merges their parts into
// `out`. kUnsupported where attention_decode_cascade_members() is 0; kInvalidArgument when the
// workspace is smaller than attention_decode_cascade_workspace_bytes(cascade.max_parts, ...).
Status launch_attention_decode_cascade(const AttentionTensors<void>& tensors,
                                       const DecodeCascade& cascade, int32_t n_work,
                                       int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                       DType dtype, float scale, void* workspace,
                                       size_t workspace_bytes, KernelStream stream);

}  // namespace litellama
