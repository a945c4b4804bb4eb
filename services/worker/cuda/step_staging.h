// Host side of one CUDA step: every small array the kernels read, derived from the step's
// StepBatchView and packed into one pinned staging buffer so a single cudaMemcpyAsync moves it to
// the device buffer of the same layout (the penalty history travels in a buffer of its own, and
// new slots that lie in registered memory are copied from there: see the runner).
//
// Layout: the arrays whose sizes depend only on (n_tokens, n_seqs) come first, at offsets that are
// a function of those two counts alone, then the variable-length new slot-table entries. A decode
// step of a given batch size therefore always finds its arrays at the same device addresses,
// which is what a captured CUDA graph needs. The slot table itself lives on the device from step
// to step (the runner's); the step's new entries are written into it before its kernels run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "services/worker/model_config.h"
#include "services/worker/model_runner.h"

namespace litellama {

// Byte offsets into the staging buffer.
struct StepLayout {
  size_t token_ids = 0;        // int32 [n_tokens]
  size_t positions = 0;        // int32 [n_tokens]
  size_t token_slot = 0;       // int32 [n_tokens] KV slot each new token writes
  size_t token_freq_row = 0;   // int32 [n_tokens] row of freq_table (dynamic NTK only)
  size_t token_start = 0;      // int32 [n_seqs + 1]
  size_t kv_len = 0;           // int32 [n_seqs]
  size_t slot_start = 0;       // int32 [n_seqs] table index of each sequence's position 0
  size_t new_slot_start = 0;   // int32 [n_seqs + 1] offsets into new_slots
  size_t work_seqs = 0;        // int32 [n_seqs] decode sequences (n_new == 1), then the others
  size_t sample_rows = 0;      // int32 [n_seqs] token row of each sampled sequence's last token
  size_t sampling_rows = 0;    // SamplingRow [n_seqs]
  size_t freq_table = 0;       // float [n_seqs + 1, head_dim / 2] (dynamic NTK only)
  size_t embed_index = 0;      // int32 [n_embed] StepBatchView::embed_token_index
  size_t embed_row_index = 0;  // int32 [n_embed] StepBatchView::embed_row_index (when given)
  // Shared-prefix decode (kernels/attention_decode.h's DecodeCascade), reserved when the step
  // may take it (StepPlan::cascade_max_tasks > 0).
  size_t cascade_n_tasks = 0;     // int32 [1]
  size_t cascade_tasks = 0;       // int32 [cascade_max_tasks][kDecodeTaskFields]
  size_t cascade_members = 0;     // int32 [cascade_max_tasks][2]
  size_t cascade_part_start = 0;  // int32 [n_decode + 1]
  size_t new_slots = 0;           // int32 [n_new_slots] StepBatchView::new_slots (last)
  size_t total_bytes = 0;
};

struct StepPlan {
  StepLayout layout;
  int32_t n_tokens = 0;
  int32_t n_seqs = 0;
  int32_t n_decode = 0;   // work_seqs[0 .. n_decode)
  int32_t n_prefill = 0;  // work_seqs[n_decode .. n_seqs)
  int32_t max_decode_kv_len = 0;
  int32_t max_prefill_n_new = 0;
  int32_t n_new_slots = 0;
  bool dynamic_rope = false;
  std::vector<int32_t> sampled_seqs;  // [n_sampled] sequence of each sampled row
  bool greedy_only = true;            // every sampled row greedy (temperature 0) without penalties
  // Input embedding rows that replace the lookup of some tokens (StepBatch::embed_rows), read in
  // place on the device.
  int32_t n_embed = 0;
  const float* embed_rows = nullptr;
  bool embed_by_row_index = false;  // token j reads row embed_row_index[j], else row j
  bool logprobs = false;            // StepBatch::logprobs: the sampler returns logprobs
  // Shared-prefix decode: the bounds the layout reserves (0: none) and, set by fill_step, the
  // tasks it planned (0: the plain decode kernel runs).
  int32_t cascade_max_tasks = 0;
  int32_t cascade_max_parts = 0;
  int32_t n_cascade_tasks = 0;
};

// How fill_step plans shared-prefix decode; members 0 turns it off.
struct CascadeOptions {
  int32_t members = 0;  // attention_decode_cascade_members() of the runner's model and dtype
  int32_t n_sms = 0;    // the device's multiprocessors (for the prefix tasks' key splits)
};

// Decode steps of at least this many sequences reserve the cascade's arrays.
inline constexpr int32_t kCascadeMinDecode = 16;
// A group's common prefix must be this long to be read once for all (shorter ones are not
// worth the merge), and each split of it at least this long.
inline constexpr int32_t kCascadeMinSharedKeys = 256;
// Key splits of one group's prefix at most (for parallelism when the groups are few).
inline constexpr int32_t kCascadeMaxPrefixSplits = 4;

// What the cascade planner keeps between steps so that it compares two tables only where it has
// not already found them equal since their last write: the step in which each block of kBlock
// table entries was last written, and for decode sequences (by their table start, direct-mapped
// per block: two starts in one block evict each other) the lead each was compared with, how many
// leading entries they agreed on, and in which step. Agreement over [0, n) still holds in a later
// step when no block holding those entries of either table has been written since; the
// comparison then resumes at n. One per runner, sized to its table.
struct CascadeMemo {
  static constexpr int32_t kBlock = 256;
  struct Agreement {
    int32_t start = -1;  // the sequence's table start (-1: empty)
    int32_t lead_start = 0;
    int32_t agreed = 0;
    uint64_t step = 0;
  };
  explicit CascadeMemo(size_t table_capacity)
      : written(table_capacity / kBlock + 1, 0), agreed(written.size()) {}
  std::vector<uint64_t> written;  // [table entries / kBlock] step of the block's last write
  std::vector<Agreement> agreed;  // [table entries / kBlock] by table start / kBlock
  uint64_t step = 0;
};

// cascade: whether the step may take the shared-prefix decode (reserves its arrays).
StepPlan plan_step(const StepBatchView& batch, const ModelConfig& config, bool cascade = false);

// Range-checks the new slots against n_kv_slots (StepBatchView::validate with check_slots = false
// leaves that to this pass), then writes them into `table` (the host copy of the runner's slot
// table, at least StepBatchView::validate's table_capacity entries) and the arrays of `plan` into
// `host` (at least plan.layout.total_bytes). With copy_new_slots false the new slots are left out
// of `host` (the caller copies them to the device from where they lie). An out-of-range slot is
// refused with kInvalidArgument before anything is written.
//
// Decode sequences are listed ordered by their tables' first slot, so that those sharing a cached
// prefix are side by side. Where the layout reserves the cascade, groups of at least two of them
// whose tables agree over kCascadeMinSharedKeys keys or more get cascade tasks and
// plan->n_cascade_tasks says how many. With a memo (the same one for every step over `table`)
// the planner skips the comparisons of entries found equal in earlier steps and unwritten since;
// the plan is the same with or without it.
Status fill_step(const StepBatchView& batch, const ModelConfig& config, StepPlan* plan,
                 int32_t n_kv_slots, bool copy_new_slots, int32_t* table, void* host,
                 const CascadeOptions& cascade = {}, CascadeMemo* memo = nullptr);

}  // namespace litellama
