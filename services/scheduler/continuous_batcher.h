// ContinuousBatcher: which sequences run in the next step. Requests join and leave the running
// batch at every step: each step carries one decode token per running request that has its last
// token, prefill chunks of requests still reading their prompt, and newly admitted requests as
// far as the token budget allows (chunked prefill). Admission is by KV slots: a request is
// admitted only when prompt + max_tokens slots can be reserved, so a running request never waits
// for slots and nothing has to be preempted.
//
// Overlap: the next step is planned while the current one runs. A decode token that the current
// step is still sampling is written as a placeholder (-(seq index in the current step) - 1) that
// the worker resolves from its previous output. A request that finishes when a step's result
// arrives may already be in the following step; its slots are released once that step is done.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/proto/step_ring.h"
#include "services/scheduler/kv_slot_allocator.h"
#include "services/scheduler/request.h"

namespace litellama {

struct BatcherOptions {
  int32_t max_batch_tokens = 2048;   // tokens of one step
  int32_t max_batch_seqs = 128;      // sequences of one step
  int32_t max_prefill_chunk = 1024;  // prompt tokens of one request in one step
};

// What the scheduler remembers about a step it sent: which request each sequence belongs to.
struct PlannedStep {
  uint64_t step_id = 0;
  std::vector<uint64_t> request_ids;  // [n_seqs]
  std::vector<uint8_t> sampled;       // [n_seqs]
  int32_t n_tokens = 0;
  int32_t n_prefill_tokens = 0;
  int32_t n_top_logits = 0;  // the header's: top logits the worker returns per sampled sequence
};

// The top logits a finished step returned, as the ring holds them (see StepView::top_ids).
struct StepTopLogits {
  std::span<const int32_t> ids;   // [n_seqs * kMaxStepTopLogits]
  std::span<const float> values;  // [n_seqs * kMaxStepTopLogits]
};

class ContinuousBatcher {
 public:
  ContinuousBatcher(KvSlotAllocator& allocator, BatcherOptions options);

  // What the worker serves: prompts with ids outside the vocabulary or longer than the context
  // are refused at admission; eos_ids stop every request that does not ignore EOS.
  void set_model(int32_t vocab_size, int64_t max_model_len, std::vector<int32_t> eos_ids);

  // Adds a request with its prompt ids to the admission queue (state kWaiting).
  void enqueue(Request* request);
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }

  // Plans step `step_id` into `view`, bounded by its limits too. nullopt when nothing can run.
  // Requests that can never run (longer than the pool or the context, ids outside the
  // vocabulary) are finished with kError and listed in *rejected.
  std::optional<PlannedStep> plan(uint64_t step_id, proto::StepView view,
                                  const proto::StepRingLimits& limits,
                                  std::vector<Request*>* rejected);

  // Applies the sampled ids of a finished step (in step order). Requests that received a token
  // are appended to *updated; those that finished on a stop id or max_tokens are retired and
  // have `finish` set. A request that asked for top logits gets them with its first token.
  void complete(const PlannedStep& step, std::span<const int32_t> sampled_ids,
                std::vector<Request*>* updated, const StepTopLogits& top = {});

  // Takes a request out (finished, aborted, failed): no further steps; its reservation is
  // returned now and its slots as soon as no sent step uses them. Safe for any state.
  void retire(Request* request);

  // The worker is gone: every sent step is void and the pool with it. Running requests are
  // retired and returned (the caller answers them); waiting requests stay queued.
  std::vector<Request*> drop_running();

  uint64_t last_completed_step() const { return last_completed_step_; }

 private:
  struct DeferredRelease {
    uint64_t step_id;
    std::vector<int32_t> slots;
  };

  bool add_sequence(Request* r, uint64_t step_id, proto::StepView& view,
                    const proto::StepRingLimits& limits, int32_t* budget_tokens, PlannedStep* step);
  void release_deferred();

  KvSlotAllocator& allocator_;
  BatcherOptions options_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;                 // admission order
  std::unordered_map<uint64_t, Request*> by_id_;  // running requests
  // Sequence index of each sampled request in the last planned step (for placeholders).
  std::unordered_map<uint64_t, int32_t> last_step_seq_;
  uint64_t last_planned_step_ = 0;
  uint64_t last_completed_step_ = 0;
  std::vector<DeferredRelease> deferred_;
  int32_t vocab_size_ = 0;
  int64_t max_model_len_ = 0;
  std::vector<int32_t> eos_ids_;
  // Step-local counters while planning.
  int32_t n_slots_used_ = 0;
  int32_t n_history_used_ = 0;
};

}  // namespace litellama
