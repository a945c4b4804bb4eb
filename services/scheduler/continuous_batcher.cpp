#include "services/scheduler/continuous_batcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace litellama {

const char* request_finish_name(RequestFinish finish) {
  switch (finish) {
    case RequestFinish::kStop:
      return "stop";
    case RequestFinish::kLength:
      return "length";
    case RequestFinish::kAbort:
      return "abort";
    case RequestFinish::kError:
      return "error";
  }
  return "error";
}

namespace {

// Prompt and generated ids of r as one array: the prefix cache's key. An image's positions hold
// a value of its hash and the row instead of the image token (negative: never a vocabulary id),
// so that prompts with other images never share their KV.
std::vector<int32_t> known_ids(const Request* r) {
  std::vector<int32_t> ids = r->prompt_ids;
  ids.insert(ids.end(), r->output_ids.begin(), r->output_ids.end());
  for (const RequestImage& image : r->images) {
    for (int32_t k = 0; k < r->image_rows; ++k) {
      const size_t at = static_cast<size_t>(image.pos + k);
      if (image.pos < 0 || at >= ids.size()) break;
      const uint64_t mixed = (image.hash ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(k + 1))) *
                             0xbf58476d1ce4e5b9ull;
      ids[at] = -1 - static_cast<int32_t>(mixed >> 34);  // in [-2^30, -1]
    }
  }
  return ids;
}

// Calls f with r's cache key (known_ids), without a copy when that is the prompt as it is.
template <typename F>
auto with_key(const Request* r, F&& f) {
  if (r->output_ids.empty() && r->images.empty()) return f(std::span<const int32_t>(r->prompt_ids));
  const std::vector<int32_t> ids = known_ids(r);
  return f(std::span<const int32_t>(ids));
}

}  // namespace

ContinuousBatcher::ContinuousBatcher(KvSlotAllocator& allocator, BatcherOptions options)
    : allocator_(allocator), options_(options), cache_(allocator) {}

void ContinuousBatcher::set_model(int32_t vocab_size, int64_t max_model_len,
                                  std::vector<int32_t> eos_ids) {
  vocab_size_ = vocab_size;
  max_model_len_ = max_model_len;
  eos_ids_ = std::move(eos_ids);
  // Limits may have changed: every waiting request is checked again.
  for (Request* r : waiting_) r->validated = false;
}

void ContinuousBatcher::queue(Request* r) {
  auto before = [](const Request* a, const Request* b) {
    return a->priority != b->priority ? a->priority > b->priority : a->arrival_seq < b->arrival_seq;
  };
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, before), r);
}

void ContinuousBatcher::set_vision(std::string pool_name, uint64_t incarnation,
                                   int32_t image_rows) {
  vision_pool_ = std::move(pool_name);
  vision_incarnation_ = incarnation;
  image_rows_ = image_rows;
}

void ContinuousBatcher::enqueue(Request* request) {
  request->state = RequestState::kWaiting;
  request->arrival_seq = ++next_arrival_;
  queue(request);
}

std::map<int32_t, int32_t> ContinuousBatcher::n_waiting_by_priority() const {
  std::map<int32_t, int32_t> out;
  for (const Request* r : waiting_) ++out[r->priority];
  return out;
}

bool ContinuousBatcher::make_room(int32_t n) {
  if (allocator_.n_free() < n && options_.prefix_cache) {
    // An eviction walks the whole tree, so it frees a batch at a time: at least 1/64 of the
    // pool (the least recently used prefixes) instead of one slot per new token, which in a
    // pool full of cached prefixes cost a walk per running request per step.
    const int32_t batch = std::max(1, allocator_.n_total() / 64);
    (void)cache_.evict(std::max(n - allocator_.n_free(), batch));
  }
  return allocator_.n_free() >= n;
}

ContinuousBatcher::AddResult ContinuousBatcher::add_sequence(Request* r, uint64_t step_id,
                                                             proto::StepView& view,
                                                             const proto::StepRingLimits& limits,
                                                             int32_t* budget_tokens,
                                                             PlannedStep* step) {
  proto::StepHeader& h = *view.header;
  const int32_t n_known = r->n_known();
  bool sample = true;
  bool placeholder = false;
  int32_t n_new = 0;
  if (r->n_fed < n_known) {
    // Ids whose KV is missing: the prompt (or prompt and outputs after a preemption) in chunks,
    // or the one known id of a decode step. The last of them is sampled from.
    if (r->n_generated() + r->n_pending >= r->max_tokens) return AddResult::kSkipped;
    n_new = std::min({n_known - r->n_fed, *budget_tokens, options_.max_prefill_chunk});
  } else {
    // Decode on the id the last planned step is still sampling.
    if (r->n_generated() + r->n_pending >= r->max_tokens) return AddResult::kSkipped;
    if (!(r->n_fed == n_known && r->n_pending > 0 && r->last_sample_step_id == last_planned_step_ &&
          last_step_seq_.count(r->id))) {
      return AddResult::kSkipped;
    }
    n_new = std::min(1, *budget_tokens);
    placeholder = true;
  }
  if (n_new <= 0) return AddResult::kSkipped;
  const bool penalties = r->sampling.has_penalties();
  // The step's slot table and history hold the whole KV of every sequence.
  const int32_t room_slots = limits.max_slots - n_slots_used_ - r->n_fed;
  if (room_slots <= 0) return AddResult::kSkipped;
  n_new = std::min(n_new, room_slots);
  if (penalties) {
    const int32_t room_history = limits.max_history - n_history_used_ - r->n_fed;
    if (room_history <= 0) return AddResult::kSkipped;
    n_new = std::min(n_new, room_history);
  }
  if (!make_room(n_new)) {
    // A prefill chunk takes what is there; a decode token needs its slot.
    const int32_t have = allocator_.n_free();
    if (placeholder || have <= 0) return AddResult::kNoRoom;
    n_new = have;
  }
  sample = placeholder || r->n_fed + n_new == n_known;
  const bool prefill = r->n_fed < r->n_prompt() || n_new > 1;
  const int32_t kv_len = r->n_fed + n_new;

  // The images whose positions this step's tokens [n_fed, kv_len) may cover.
  int32_t n_images = 0;
  for (const RequestImage& image : r->images) {
    if (image.pos < kv_len && image.pos + r->image_rows > r->n_fed) ++n_images;
  }
  if (n_images > 0 && r->images_lost) {
    if (std::find(images_gone_.begin(), images_gone_.end(), r) == images_gone_.end()) {
      images_gone_.push_back(r);
    }
    return AddResult::kSkipped;
  }
  if (n_images > 0 && (h.n_images + n_images > limits.max_images || vision_pool_.empty() ||
                       r->image_rows != image_rows_)) {
    return AddResult::kSkipped;
  }
  const int32_t s = h.n_seqs;
  if (!place_table(r, kv_len, limits)) return AddResult::kSkipped;
  view.image_start[static_cast<size_t>(s)] = h.n_images;
  for (RequestImage& image : r->images) {
    if (image.pos >= kv_len || image.pos + r->image_rows <= r->n_fed) continue;
    view.image_slot[static_cast<size_t>(h.n_images)] = image.slot;
    view.image_pos[static_cast<size_t>(h.n_images)] = image.pos;
    ++h.n_images;
    // The first step that reads an image just encoded carries when its rows were complete.
    h.images_ready_unix_ns = std::max(h.images_ready_unix_ns, image.ready_unix_ns);
    image.ready_unix_ns = 0;
  }
  view.image_start[static_cast<size_t>(s + 1)] = h.n_images;
  (void)allocator_.allocate(n_new, &r->slots);

  for (int32_t i = 0; i < n_new; ++i) {
    const int32_t pos = r->n_fed + i;
    view.token_ids[static_cast<size_t>(h.n_tokens + i)] =
        placeholder ? -(last_step_seq_.at(r->id) + 1) : r->token_at(pos);
    view.positions[static_cast<size_t>(h.n_tokens + i)] = pos;
  }
  h.n_tokens += n_new;
  view.token_start[static_cast<size_t>(s + 1)] = h.n_tokens;
  view.kv_len[static_cast<size_t>(s)] = kv_len;
  // Only the table entries the worker does not have yet.
  std::copy(r->slots.begin() + r->table_sent, r->slots.end(),
            view.new_slots.begin() + h.n_new_slots);
  h.n_new_slots += kv_len - r->table_sent;
  r->table_sent = kv_len;
  n_slots_used_ += kv_len;
  view.slot_start[static_cast<size_t>(s)] = static_cast<int32_t>(r->table_base);
  view.new_slot_start[static_cast<size_t>(s + 1)] = h.n_new_slots;
  view.sample[static_cast<size_t>(s)] = sample ? 1 : 0;
  view.sampling[static_cast<size_t>(s)] = r->sampling;
  view.n_generated[static_cast<size_t>(s)] = r->n_generated() + r->n_pending;
  if (penalties) {
    // Prompt then generated ids up to the fed token; the one being sampled is a placeholder.
    for (int32_t k = 0; k < kv_len; ++k) {
      view.history_ids[static_cast<size_t>(n_history_used_ + k)] =
          (placeholder && k == kv_len - 1) ? -(last_step_seq_.at(r->id) + 1) : r->token_at(k);
    }
    n_history_used_ += kv_len;
  }
  view.history_start[static_cast<size_t>(s + 1)] = n_history_used_;
  view.n_prompt[static_cast<size_t>(s)] = penalties ? r->n_prompt() : 0;
  h.n_seqs = s + 1;

  if (sample && r->n_top_logits > 0 && r->n_generated() + r->n_pending == 0) {
    h.n_top_logits = std::max(h.n_top_logits, std::min(r->n_top_logits, proto::kMaxStepTopLogits));
  }
  if (sample && r->logprobs) {
    // Logprobs are computed for every sampled row of a step when any row asks (one flag in the
    // header, one log-sum-exp pass per row): the top list comes from the top logits.
    h.logprobs = 1;
    h.n_top_logits = std::max(h.n_top_logits, r->n_top_logprobs);
  }
  r->n_fed = kv_len;
  r->last_step_id = step_id;
  if (options_.prefix_cache && sample && !placeholder && n_new > 1) {
    // The prompt's KV is complete once this step ran: later requests share it from now on (any
    // step that reads it runs after this one).
    const std::vector<int32_t> ids = known_ids(r);
    (void)cache_.insert(std::span<const int32_t>(ids.data(), static_cast<size_t>(kv_len)),
                        r->slots);
  }
  if (sample) {
    ++r->n_pending;
    r->last_sample_step_id = step_id;
  }
  *budget_tokens -= n_new;
  step->request_ids.push_back(r->id);
  step->sampled.push_back(sample ? 1 : 0);
  step->n_tokens += n_new;
  if (prefill) step->n_prefill_tokens += n_new;
  return AddResult::kAdded;
}

bool ContinuousBatcher::validate(Request* r, const proto::StepRingLimits& limits) {
  if (r->validated) return true;
  if (r->max_tokens == proto::kMaxTokensRestOfContext) {
    // "The rest of the context": what the model's context (capped by the pool) leaves after the
    // prompt; at least 1, so that a prompt that fills it is refused below.
    const int64_t room = max_model_len_ > 0
                             ? std::min<int64_t>(max_model_len_, allocator_.n_total())
                             : allocator_.n_total();
    r->max_tokens = static_cast<int32_t>(std::clamp<int64_t>(room - r->n_prompt(), 1, 1 << 30));
  }
  const int64_t need = static_cast<int64_t>(r->n_prompt()) + r->max_tokens;
  const auto bad_id = std::find_if(r->prompt_ids.begin(), r->prompt_ids.end(),
                                   [&](int32_t id) { return id < 0 || id >= vocab_size_; });
  const int64_t pool = std::min<int64_t>(allocator_.n_total(), limits.max_slots);
  std::string& why = r->reject_reason;
  if (bad_id != r->prompt_ids.end()) {
    why = fmt::format("prompt id {} is outside the vocabulary of {} ids", *bad_id, vocab_size_);
  } else if (max_model_len_ > 0 && need > max_model_len_) {
    why = fmt::format(
        "prompt ({} tokens) + max_tokens ({}) = {} exceeds the model's context of {} tokens by "
        "{}",
        r->n_prompt(), r->max_tokens, need, max_model_len_, need - max_model_len_);
  } else if (need > pool) {
    why = fmt::format(
        "prompt ({} tokens) + max_tokens ({}) = {} exceeds the KV pool of {} slots by {}",
        r->n_prompt(), r->max_tokens, need, pool, need - pool);
  }
  r->validated = why.empty();
  return r->validated;
}

Request* ContinuousBatcher::pick_waiting() {
  // The top priority's requests in arrival order; a preempted one whose last id is still being
  // sampled is not ready.
  std::vector<Request*> group;
  for (Request* r : waiting_) {
    if (r->priority != waiting_.front()->priority) break;
    if (r->n_pending > 0) continue;
    group.push_back(r);
    if (static_cast<int32_t>(group.size()) >= std::max(1, options_.prefix_scan_limit)) break;
  }
  if (group.empty()) return nullptr;
  if (!options_.prefix_cache || group.front()->n_passed_over >= options_.max_passed_over) {
    return group.front();
  }
  size_t best = 0;
  int32_t best_len = -1;
  for (size_t i = 0; i < group.size(); ++i) {
    const Request* r = group[i];
    const int32_t len = with_key(
        r, [&](std::span<const int32_t> ids) { return cache_.peek(ids, r->n_known() - 1); });
    if (len > best_len) {
      best = i;
      best_len = len;
    }
    // Nobody may be passed over by a request behind one that reached the bound.
    if (r->n_passed_over >= options_.max_passed_over) break;
  }
  for (size_t i = 0; i < best; ++i) ++group[i]->n_passed_over;
  return group[best];
}

Request* ContinuousBatcher::pick_victim(uint64_t step_id) const {
  Request* victim = nullptr;
  for (Request* r : running_) {
    if (r->last_step_id == step_id) continue;  // already written into this step
    if (!victim || r->priority < victim->priority ||
        (r->priority == victim->priority && r->admit_seq > victim->admit_seq)) {
      victim = r;
    }
  }
  return victim;
}

void ContinuousBatcher::give_up_slots(Request* r, int32_t n_cache) {
  n_cache = std::min(n_cache, static_cast<int32_t>(r->slots.size()));
  if (options_.prefix_cache && n_cache > 0) {
    const std::vector<int32_t> ids = known_ids(r);
    (void)cache_.insert(std::span<const int32_t>(ids.data(), static_cast<size_t>(n_cache)),
                        std::span<const int32_t>(r->slots.data(), static_cast<size_t>(n_cache)));
  }
  if (!r->slots.empty()) {
    if (r->last_step_id > last_completed_step_) {
      n_deferred_slots_ += static_cast<int64_t>(r->slots.size());
      deferred_.push_back({r->last_step_id, std::move(r->slots)});
    } else {
      allocator_.release(r->slots);
    }
    r->slots.clear();
  }
  r->table_epoch = 0;
}

bool ContinuousBatcher::place_table(Request* r, int32_t kv_len,
                                    const proto::StepRingLimits& limits) {
  if (r->table_epoch == table_epoch_ && kv_len <= r->table_cap) return true;
  // A new place, twice the length (rounded to 16), so that a growing table moves O(log n)
  // times; the worker gets the whole table there.
  const int64_t cap =
      std::min<int64_t>((int64_t{2} * kv_len + 15) / 16 * 16, limits.table_capacity);
  if (kv_len > cap || table_next_ + cap > limits.table_capacity) return false;
  r->table_base = table_next_;
  r->table_cap = static_cast<int32_t>(cap);
  r->table_sent = 0;
  r->table_epoch = table_epoch_;
  table_next_ += cap;
  return true;
}

void ContinuousBatcher::reset_tables() {
  table_epoch_ = table_epoch_ == UINT32_MAX ? 1 : table_epoch_ + 1;
  table_next_ = 0;
  epoch_started_ = false;
}

void ContinuousBatcher::preempt(Request* r) {
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  // Positions with known ids have their KV written (or being written by a sent step, which runs
  // before any step that could read it from the cache).
  give_up_slots(r, std::min(r->n_fed, r->n_known()));
  r->n_fed = 0;
  r->state = RequestState::kWaiting;
  ++r->n_preemptions;
  ++stats_.preemptions;
  queue(r);  // stays in by_id_: a sent step may still return its next id
}

std::optional<PlannedStep> ContinuousBatcher::plan(uint64_t step_id, proto::StepView view,
                                                   const proto::StepRingLimits& limits,
                                                   std::vector<Request*>* rejected) {
  const int32_t max_seqs = std::min(options_.max_batch_seqs, limits.max_seqs);
  int32_t budget_tokens = std::min(options_.max_batch_tokens, limits.max_tokens);
  proto::StepHeader& h = *view.header;
  h = proto::StepHeader{};
  h.step_id = step_id;
  // Tables placed since the last epoch began leave too little room for one more step's (each
  // place is at most 2 kv_len + 15 entries, the kv_len of one step sum to at most max_slots):
  // a new epoch lays out afresh, from this step's sequences.
  const int64_t step_room = int64_t{2} * limits.max_slots + int64_t{16} * limits.max_seqs;
  if (table_next_ + step_room > limits.table_capacity) reset_tables();
  h.table_epoch = table_epoch_;
  h.epoch_start = epoch_started_ ? 0 : 1;
  view.token_start[0] = 0;
  view.new_slot_start[0] = 0;
  view.history_start[0] = 0;
  view.image_start[0] = 0;
  h.image_rows = image_rows_;
  h.vision_incarnation = vision_incarnation_;
  const size_t name_len = std::min(vision_pool_.size(), proto::kVisionPoolNameBytes - 1);
  std::copy_n(vision_pool_.data(), name_len, h.vision_pool);
  h.vision_pool[name_len] = '\0';
  n_slots_used_ = 0;
  n_history_used_ = 0;

  PlannedStep step;
  step.step_id = step_id;
  std::unordered_map<uint64_t, int32_t> seq_of;
  auto add = [&](Request* r) {
    if (h.n_seqs >= max_seqs || budget_tokens <= 0) return AddResult::kSkipped;
    const AddResult result = add_sequence(r, step_id, view, limits, &budget_tokens, &step);
    if (result == AddResult::kAdded && step.sampled.back()) seq_of[r->id] = h.n_seqs - 1;
    return result;
  };
  const std::vector<Request*> running = running_;
  for (Request* r : running) {
    if (r->state != RequestState::kRunning) continue;  // preempted for an earlier one
    AddResult result = add(r);
    // Out of slots: preempt the lowest-priority, newest request (maybe r itself) unless slots
    // that sent steps still use are enough once those steps are done.
    while (result == AddResult::kNoRoom && n_deferred_slots_ == 0) {
      Request* victim = pick_victim(step_id);
      if (victim == nullptr) break;
      preempt(victim);
      if (victim == r) break;
      result = add(r);
    }
  }

  // Reject what can never run, wherever it waits.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Request* r = *it;
    if (validate(r, limits)) {
      ++it;
      continue;
    }
    it = waiting_.erase(it);
    by_id_.erase(r->id);
    r->finish = RequestFinish::kError;
    r->state = RequestState::kFinished;
    rejected->push_back(r);
  }

  // Admission while there is room for the uncached ids and a decode slot per running request.
  while (!waiting_.empty() && h.n_seqs < max_seqs && budget_tokens > 0) {
    Request* r = pick_waiting();
    if (r == nullptr) break;
    const int32_t n_known = r->n_known();
    int32_t matched = 0;
    if (options_.prefix_cache) {
      matched = with_key(r, [&](std::span<const int32_t> ids) {
        return cache_.match(ids, n_known - 1, &r->slots);
      });
    }
    const int64_t need = static_cast<int64_t>(n_known - matched) + n_running();
    // Room means free slots, or cached ones nobody holds: those are evicted now, as their
    // allocation would evict them anyway (LRU first), which is cheaper than counting them.
    if (!running_.empty() && need > allocator_.n_free() &&
        !make_room(static_cast<int32_t>(std::min<int64_t>(need, allocator_.n_total())))) {
      allocator_.release(r->slots);  // the match's references
      r->slots.clear();
      break;
    }
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
    if (!r->admitted_once) {
      r->admitted_once = true;
      r->n_cached_tokens = matched;
      stats_.prefix_queried_tokens += n_known;
      stats_.prefix_hit_tokens += matched;
    }
    r->n_fed = matched;
    r->n_passed_over = 0;
    r->admit_seq = ++next_admit_;
    r->state = RequestState::kRunning;
    running_.push_back(r);
    by_id_[r->id] = r;
    if (add(r) == AddResult::kNoRoom) break;  // waits for its first slots as a running request
  }

  for (Request* r : images_gone_) {
    r->reject_reason = "its images are gone with the vision service that encoded them";
    r->finish = RequestFinish::kError;
    retire(r);
    rejected->push_back(r);
  }
  images_gone_.clear();

  if (h.n_seqs == 0) return std::nullopt;
  epoch_started_ = true;
  h.n_history = n_history_used_;
  step.n_top_logits = h.n_top_logits;
  step.logprobs = h.logprobs == 1;
  last_planned_step_ = step_id;
  last_step_seq_ = std::move(seq_of);
  return step;
}

void ContinuousBatcher::complete(const PlannedStep& step, std::span<const int32_t> sampled_ids,
                                 std::vector<Request*>* updated, const StepTopLogits& top) {
  last_completed_step_ = step.step_id;
  for (size_t i = 0; i < step.request_ids.size(); ++i) {
    if (!step.sampled[i]) continue;
    auto it = by_id_.find(step.request_ids[i]);
    if (it == by_id_.end()) continue;  // retired while the step ran
    Request* r = it->second;
    r->n_pending = std::max(0, r->n_pending - 1);
    const int32_t id = i < sampled_ids.size() ? sampled_ids[i] : -1;
    if (id < 0) {
      r->finish = RequestFinish::kError;
      retire(r);
      updated->push_back(r);
      continue;
    }
    if (r->output_ids.empty() && r->n_top_logits > 0 && step.n_top_logits > 0) {
      const size_t base = i * proto::kMaxStepTopLogits;
      const size_t k = static_cast<size_t>(std::min(r->n_top_logits, step.n_top_logits));
      r->top_logits.clear();
      for (size_t j = 0; j < k && base + j < top.ids.size() && base + j < top.values.size(); ++j) {
        if (top.ids[base + j] < 0) break;
        r->top_logits.emplace_back(top.ids[base + j], top.values[base + j]);
      }
    }
    if (r->logprobs) record_logprobs(r, step, top, i);
    r->output_ids.push_back(id);
    const auto& stops = r->stop_token_ids;
    const bool eos =
        !r->ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
    if (eos || std::find(stops.begin(), stops.end(), id) != stops.end()) {
      r->finish = RequestFinish::kStop;
    } else if (r->n_generated() >= r->max_tokens) {
      r->finish = RequestFinish::kLength;
    }
    if (r->finish) retire(r);
    updated->push_back(r);
  }
  release_deferred();
}

void ContinuousBatcher::record_logprobs(Request* r, const PlannedStep& step,
                                        const StepTopLogits& top, size_t seq) {
  const bool known = step.logprobs && seq < top.logprobs.size() && seq < top.lse.size();
  r->output_logprobs.push_back(known ? top.logprobs[seq] : std::numeric_limits<float>::quiet_NaN());
  auto& list = r->output_top_logprobs.emplace_back();
  if (!known) return;
  const float lse = top.lse[seq];
  const size_t base = seq * proto::kMaxStepTopLogits;
  const size_t k = static_cast<size_t>(std::min(r->n_top_logprobs, step.n_top_logits));
  for (size_t j = 0; j < k && base + j < top.ids.size() && base + j < top.values.size(); ++j) {
    if (top.ids[base + j] < 0) break;
    list.emplace_back(top.ids[base + j], top.values[base + j] - lse);
  }
}

void ContinuousBatcher::retire(Request* r) {
  if (r->state == RequestState::kWaiting) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  }
  if (by_id_.erase(r->id) > 0) {
    running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  }
  last_step_seq_.erase(r->id);
  // A failed request's KV may be the cause: only clean ends fill the cache.
  const bool clean = r->finish != RequestFinish::kError;
  give_up_slots(r, clean ? std::min(r->n_fed, r->n_known()) : 0);
  r->n_pending = 0;
  r->state = RequestState::kFinished;
}

void ContinuousBatcher::release_deferred() {
  auto done = [&](const DeferredRelease& d) { return d.step_id <= last_completed_step_; };
  for (const DeferredRelease& d : deferred_) {
    if (!done(d)) continue;
    allocator_.release(d.slots);
    n_deferred_slots_ -= static_cast<int64_t>(d.slots.size());
  }
  deferred_.erase(std::remove_if(deferred_.begin(), deferred_.end(), done), deferred_.end());
}

std::vector<int32_t> ContinuousBatcher::deferred_slots() const {
  std::vector<int32_t> out;
  for (const DeferredRelease& d : deferred_) out.insert(out.end(), d.slots.begin(), d.slots.end());
  return out;
}

void ContinuousBatcher::clear_cache(bool pool_kept) {
  cache_.clear(pool_kept);
}

std::vector<Request*> ContinuousBatcher::drop_running() {
  std::vector<Request*> dropped = running_;
  cache_.clear(false);  // the pool is gone with the worker
  for (Request* r : dropped) {
    r->slots.clear();
    retire(r);
  }
  // Preempted requests wait on: what they generated is kept, the ids their lost steps were
  // sampling are not coming.
  for (Request* r : waiting_) {
    r->n_pending = 0;
    by_id_.erase(r->id);
  }
  deferred_.clear();
  n_deferred_slots_ = 0;
  last_step_seq_.clear();
  last_completed_step_ = last_planned_step_;
  return dropped;
}

}  // namespace litellama
