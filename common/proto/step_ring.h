// StepRing: the shared-memory channel for step data between the scheduler and the worker
// (Boost.Interprocess). The worker creates it once its KV pool size is known and names it in its
// heartbeat; the scheduler opens it. Two buffers, so the scheduler writes step N+1 while the
// worker runs step N; the StepRequest/StepResult doorbells on ZeroMQ hand a buffer back and forth
// and are the only synchronisation: a side touches a buffer only while it owns it.
//
// Each buffer holds one step as fixed-capacity arrays (layout below) plus the sampled ids the
// worker writes back. The worker reads the arrays in place (it may rewrite token placeholders
// there while it owns the buffer) and page-locks the mapping, so that its device copies read it
// directly.
//
// Slot tables travel as deltas. The worker keeps every sequence's table (table_capacity entries
// in all); the scheduler decides where each sequence's table lies in it (slot_start) and sends,
// per step, only the entries it did not send before in the current table epoch (new_slots). A
// new epoch (header.table_epoch changes: a new worker, a failed step, or the scheduler laying the
// tables out afresh) starts with a step that brings every sequence's whole table; the worker
// refuses a step of an epoch it has not seen start. All offsets derive from StepRingLimits, which
// the region's header records, so both sides compute the same layout; the header's magic and layout
// version are checked on open.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/proto/sampling_params.h"
#include "common/status.h"

namespace litellama::proto {

inline constexpr uint64_t kStepRingMagic = 0x4c4c4d5354455031ull;  // "LLMSTEP1"
inline constexpr uint32_t kStepRingLayoutVersion = 6;
inline constexpr int kStepRingBuffers = 2;
// Most top logits one sequence can return per step (the CUDA sampler's limit).
inline constexpr int32_t kMaxStepTopLogits = 64;

struct StepRingLimits {
  int32_t max_tokens = 0;      // tokens of one step
  int32_t max_seqs = 0;        // sequences of one step
  int32_t max_slots = 0;       // slot-table entries one step covers (sum of kv_len)
  int32_t max_history = 0;     // penalty-history ids of one step
  int64_t table_capacity = 0;  // entries of the worker's slot table
  int32_t max_images = 0;      // image entries of one step (0: the worker reads no images)
};

// Longest name of a vision embedding pool the step header carries, terminator included.
inline constexpr size_t kVisionPoolNameBytes = 64;

struct StepHeader {
  uint64_t step_id;
  int32_t n_seqs;
  int32_t n_tokens;
  uint32_t table_epoch;  // > 0; see the slot tables above
  // 1: this step brings every sequence's whole table and starts table_epoch.
  int32_t epoch_start;
  int32_t n_new_slots;
  int32_t n_history;     // 0: no sequence has penalties
  int32_t n_top_logits;  // 0..kMaxStepTopLogits, for every sampled sequence
  // 1: the worker writes logprobs and lse for every sampled sequence (a step asks for all of
  // them when any of its requests wants logprobs); 0: neither is written.
  int32_t logprobs;
  // Images (LLaVA): n_images entries in image_slot / image_pos. Each is one image of
  // image_rows rows in slot image_slot of the vision process's embedding pool, whose rows
  // replace the embeddings of the sequence's positions [image_pos, image_pos + image_rows);
  // image_start[s] .. image_start[s + 1] are sequence s's entries (any of its images the step's
  // tokens may cover). vision_pool names the pool (NUL-terminated) and vision_incarnation the
  // process that owns it: a change means a new pool for the worker to open.
  int32_t n_images;
  int32_t image_rows;
  uint64_t vision_incarnation;
  // The latest time (the vision service's Unix ns) at which the rows of an image this step reads
  // for the first time since its encode were complete; 0: none. The worker measures from it to
  // the step's launch (the hand-off from vision service to prefill).
  int64_t images_ready_unix_ns;
  char vision_pool[kVisionPoolNameBytes];
};

// One buffer's arrays, as pointers into the mapping. Sizes are capacities; the header says how
// many entries of each are in use. Meanings match StepBatch in services/worker/model_runner.h,
// except that token_ids and history_ids may hold placeholders (< 0, see StepRequest).
struct StepView {
  StepHeader* header = nullptr;
  std::span<int32_t> token_ids;        // [max_tokens]
  std::span<int32_t> positions;        // [max_tokens]
  std::span<int32_t> token_start;      // [max_seqs + 1]
  std::span<int32_t> kv_len;           // [max_seqs]
  std::span<int32_t> slot_start;       // [max_seqs] table index of each sequence's position 0
  std::span<int32_t> new_slot_start;   // [max_seqs + 1] offsets into new_slots
  std::span<int32_t> new_slots;        // [max_slots] the last entries of each sequence's table
  std::span<uint8_t> sample;           // [max_seqs]
  std::span<SamplingParams> sampling;  // [max_seqs]
  std::span<int32_t> n_generated;      // [max_seqs]
  std::span<int32_t> history_start;    // [max_seqs + 1]
  std::span<int32_t> history_ids;      // [max_history]
  std::span<int32_t> n_prompt;         // [max_seqs]
  std::span<int32_t> sampled_ids;      // [max_seqs] written by the worker
  // Written by the worker when n_top_logits > 0: sequence s's largest raw logits, largest first,
  // at [s * kMaxStepTopLogits, s * kMaxStepTopLogits + n_top_logits); id -1 pads a short list.
  std::span<int32_t> top_ids;   // [max_seqs * kMaxStepTopLogits]
  std::span<float> top_values;  // [max_seqs * kMaxStepTopLogits]
  // Written by the worker when header->logprobs is 1, of the raw logits (before penalties and
  // temperature): the sampled id's logprob and the log-sum-exp, so that top_values[i] - lse[s]
  // is the logprob of top_ids[i].
  std::span<float> logprobs;       // [max_seqs]
  std::span<float> lse;            // [max_seqs]
  std::span<int32_t> image_start;  // [max_seqs + 1] offsets into image_slot / image_pos
  std::span<int32_t> image_slot;   // [max_images]
  std::span<int32_t> image_pos;    // [max_images] position of the image's first row
};

class StepRing {
 public:
  // Creates (replacing a stale one of the same name) and owns the object; removed on destruction.
  static Result<std::unique_ptr<StepRing>> create(const std::string& name,
                                                  const StepRingLimits& limits);
  // Opens an existing ring; does not remove it on destruction.
  static Result<std::unique_ptr<StepRing>> open(const std::string& name);
  // Removes a ring left behind by a process that died (no error when there is none).
  static void remove(const std::string& name);

  ~StepRing();
  StepRing(const StepRing&) = delete;
  StepRing& operator=(const StepRing&) = delete;

  const std::string& name() const { return name_; }
  const StepRingLimits& limits() const { return limits_; }
  StepView buffer(int index);
  size_t size_bytes() const;
  // The whole mapping (both buffers), for page-locking it.
  void* data() const;

 private:
  struct Impl;
  StepRing(std::string name, bool owner, std::unique_ptr<Impl> impl, StepRingLimits limits);

  std::string name_;
  bool owner_ = false;
  std::unique_ptr<Impl> impl_;
  StepRingLimits limits_;
};

}  // namespace litellama::proto
