// ContinuousBatcher: which sequences run in the next step. Requests join and leave the running
// batch at every step: each step carries one decode token per running request that has its last
// token, prefill chunks of requests still reading their prompt, and newly admitted requests as
// far as the token budget allows (chunked prefill).
//
// Prefix cache (RadixCache, on unless BatcherOptions::prefix_cache is false): an admitted request
// starts from the longest cached prefix of its ids (at most all but the last, whose logits must be
// computed), putting the cached slots at the head of its slot table. A request's prompt KV goes
// into the cache in the step that completes its prefill (so requests admitted later share it
// while it still runs), and all the KV it wrote when it leaves. Cached prefixes nobody uses are
// evicted, least recently used first, when slots are needed.
//
// Admission without worst-case reservation: a request is admitted while the pool (free plus
// evictable slots) has room for its uncached ids and one decode slot per running request. When a
// running request finds no slot, the running request of lowest priority, newest admitted within
// it, is preempted by recompute: its KV goes into the cache, its slots are given up, and it waits
// again at its place in the queue with the ids it generated, to resume (from the cache when its
// prefix was not evicted meanwhile). A request that fits the pool alone therefore always
// completes; one whose prompt + max_tokens exceeds the pool is refused at once.
//
// Images (LLaVA): a request's image positions carry the rows of its images' pool slots; each
// step lists, per sequence, the images its tokens may cover (StepHeader::n_images). The cache key
// of an image position is not the image token id but a value drawn from the image's hash and the
// row (negative, so never a vocabulary id): prompts share cached KV only where their images are
// the same.
//
// Admission order: priority first (larger first), first come first served within a priority;
// among the first waiting requests of the top priority the one with the longest cached prefix
// goes first, but a request passed over max_passed_over times goes before any later one.
//
// Overlap: the next step is planned while the current one runs. A decode token that the current
// step is still sampling is written as a placeholder (-(seq index in the current step) - 1) that
// the worker resolves from its previous output. A request that finishes or is preempted while a
// sent step still uses its slots gives them up once that step is done.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/proto/step_ring.h"
#include "services/scheduler/kv_slot_allocator.h"
#include "services/scheduler/radix_cache.h"
#include "services/scheduler/request.h"

namespace litellama {

struct BatcherOptions {
  int32_t max_batch_tokens = 2048;   // tokens of one step
  int32_t max_batch_seqs = 128;      // sequences of one step
  int32_t max_prefill_chunk = 1024;  // prompt tokens of one request in one step
  bool prefix_cache = true;          // --no-prefix-cache turns it off
  // Longest-prefix-first admission may pass a waiting request over at most this many times.
  int32_t max_passed_over = 4;
  // How many waiting requests of the top priority longest-prefix-first admission looks at.
  int32_t prefix_scan_limit = 64;
};

// Counters of the batcher's life (the scheduler's metrics read them).
struct BatcherStats {
  int64_t prefix_queried_tokens = 0;  // ids of admitted requests looked up in the cache
  int64_t prefix_hit_tokens = 0;      // of them, found cached
  int64_t preemptions = 0;
};

// What the scheduler remembers about a step it sent: which request each sequence belongs to.
struct PlannedStep {
  uint64_t step_id = 0;
  std::vector<uint64_t> request_ids;  // [n_seqs]
  std::vector<uint8_t> sampled;       // [n_seqs]
  int32_t n_tokens = 0;
  int32_t n_prefill_tokens = 0;
  int32_t n_top_logits = 0;  // the header's: top logits the worker returns per sampled sequence
  bool logprobs = false;     // the header's: the worker returns logprobs and lse
};

// The top logits a finished step returned, as the ring holds them (see StepView::top_ids).
struct StepTopLogits {
  std::span<const int32_t> ids;   // [n_seqs * kMaxStepTopLogits]
  std::span<const float> values;  // [n_seqs * kMaxStepTopLogits]
  // With PlannedStep::logprobs: [n_seqs] each (see StepView::logprobs); else empty.
  std::span<const float> logprobs;
  std::span<const float> lse;
};

class ContinuousBatcher {
 public:
  ContinuousBatcher(KvSlotAllocator& allocator, BatcherOptions options);

  // What the worker serves: prompts with ids outside the vocabulary or longer than the context
  // are refused at admission; eos_ids stop every request that does not ignore EOS.
  void set_model(int32_t vocab_size, int64_t max_model_len, std::vector<int32_t> eos_ids);

  // The vision process's pool that image entries of steps refer to (name "" : none).
  void set_vision(std::string pool_name, uint64_t incarnation, int32_t image_rows);

  // Adds a request with its prompt ids to the admission queue (state kWaiting).
  void enqueue(Request* request);
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  std::map<int32_t, int32_t> n_waiting_by_priority() const;

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

  // Takes a request out (finished, aborted, failed): no further steps; its slots go back (into
  // the cache where they hold KV) as soon as no sent step uses them. Safe for any state.
  void retire(Request* request);
  // Appends the logprobs of sequence `seq` of a finished step to r's outputs (NaN and an empty
  // list when the step did not return them).
  void record_logprobs(Request* r, const PlannedStep& step, const StepTopLogits& top, size_t seq);

  // The worker is gone: every sent step is void and the pool with it (the cache is dropped).
  // Running requests are retired and returned (the caller answers them); waiting requests
  // (preempted ones included, with what they generated) stay queued.
  std::vector<Request*> drop_running();
  // Forgets every cached prefix. pool_kept: the pool still exists and the cache's references go
  // back to it (a step failed); false: the pool was replaced (a new worker).
  void clear_cache(bool pool_kept);
  // The worker's slot table no longer holds what was sent (a step failed, or another worker
  // serves): the next planned step starts a new table epoch and brings every sequence's table.
  void reset_tables();

  uint64_t last_completed_step() const { return last_completed_step_; }
  const BatcherStats& stats() const { return stats_; }
  const RadixCache& cache() const { return cache_; }
  bool prefix_cache_enabled() const { return options_.prefix_cache; }
  // Slots of finished or preempted requests that a sent step still uses (invariant checks).
  std::vector<int32_t> deferred_slots() const;

 private:
  struct DeferredRelease {
    uint64_t step_id;
    std::vector<int32_t> slots;
  };
  enum class AddResult { kAdded, kSkipped, kNoRoom };

  AddResult add_sequence(Request* r, uint64_t step_id, proto::StepView& view,
                         const proto::StepRingLimits& limits, int32_t* budget_tokens,
                         PlannedStep* step);
  // Makes at least n slots free, evicting cached prefixes (a batch at a time); false when it
  // cannot.
  bool make_room(int32_t n);
  bool validate(Request* r, const proto::StepRingLimits& limits);
  Request* pick_waiting();
  void queue(Request* r);  // into waiting_ at its (priority, arrival) place
  // Running request to preempt so that `for_whom` can run (maybe itself); nullptr: none.
  Request* pick_victim(uint64_t step_id) const;
  void preempt(Request* r);
  // Places r's slot table in the worker's for a kv_len of `kv_len` (a new place, from which the
  // whole table is sent, when it has none in this epoch or outgrew it); false when there is no
  // room this step.
  bool place_table(Request* r, int32_t kv_len, const proto::StepRingLimits& limits);
  // Gives r's slots up (into the cache for its first n_cache positions), now or once the
  // step using them is done.
  void give_up_slots(Request* r, int32_t n_cache);
  void release_deferred();

  KvSlotAllocator& allocator_;
  BatcherOptions options_;
  // Requests whose next step needs rows of images the vision process no longer holds: plan()
  // takes them out and returns them as rejected.
  std::vector<Request*> images_gone_;
  std::string vision_pool_;
  uint64_t vision_incarnation_ = 0;
  int32_t image_rows_ = 0;
  RadixCache cache_;
  BatcherStats stats_;
  std::deque<Request*> waiting_;                  // by priority (larger first), then arrival
  std::vector<Request*> running_;                 // admission order
  std::unordered_map<uint64_t, Request*> by_id_;  // running and preempted requests
  // Sequence index of each sampled request in the last planned step (for placeholders).
  std::unordered_map<uint64_t, int32_t> last_step_seq_;
  uint64_t last_planned_step_ = 0;
  uint64_t last_completed_step_ = 0;
  uint64_t next_arrival_ = 0;
  uint64_t next_admit_ = 0;
  std::vector<DeferredRelease> deferred_;
  int64_t n_deferred_slots_ = 0;
  int32_t vocab_size_ = 0;
  int64_t max_model_len_ = 0;
  std::vector<int32_t> eos_ids_;
  // Step-local counters while planning.
  int32_t n_slots_used_ = 0;
  int32_t n_history_used_ = 0;
  // The worker's slot table (proto::StepRing): the current epoch, whether a step of it was
  // planned (the first one brings every sequence's whole table), the next free entry.
  uint32_t table_epoch_ = 1;
  bool epoch_started_ = false;
  int64_t table_next_ = 0;
};

}  // namespace litellama
