#include "services/scheduler/continuous_batcher.h"

#include <fmt/format.h>

#include <algorithm>

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

bool has_penalties(const proto::SamplingOptions& s) {
  return s.repetition_penalty != 1.0f || s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f;
}

proto::StepSampling to_step_sampling(const proto::SamplingOptions& s) {
  proto::StepSampling out{};
  out.temperature = s.temperature;
  out.top_k = s.top_k;
  out.top_p = s.top_p;
  out.min_p = s.min_p;
  out.repetition_penalty = s.repetition_penalty;
  out.frequency_penalty = s.frequency_penalty;
  out.presence_penalty = s.presence_penalty;
  out.seed = s.seed;
  return out;
}

}  // namespace

ContinuousBatcher::ContinuousBatcher(KvSlotAllocator& allocator, BatcherOptions options)
    : allocator_(allocator), options_(options) {}

void ContinuousBatcher::set_model(int32_t vocab_size, int64_t max_model_len,
                                  std::vector<int32_t> eos_ids) {
  vocab_size_ = vocab_size;
  max_model_len_ = max_model_len;
  eos_ids_ = std::move(eos_ids);
}

void ContinuousBatcher::enqueue(Request* request) {
  request->state = RequestState::kWaiting;
  waiting_.push_back(request);
}

bool ContinuousBatcher::add_sequence(Request* r, uint64_t step_id, proto::StepView& view,
                                     const proto::StepRingLimits& limits, int32_t* budget_tokens,
                                     PlannedStep* step) {
  proto::StepHeader& h = *view.header;
  const int32_t n_known = r->n_prompt() + r->n_generated();
  const bool prefill = r->n_fed < r->n_prompt();
  int32_t n_new = 0;
  bool sample = false;
  bool placeholder = false;
  if (prefill) {
    n_new = std::min({r->n_prompt() - r->n_fed, *budget_tokens, options_.max_prefill_chunk});
    sample = r->n_fed + n_new == r->n_prompt();
  } else {
    // Decode: feed the token at index n_fed, known or being sampled by the last planned step.
    if (r->n_generated() + r->n_pending >= r->max_tokens) return false;
    if (r->n_fed < n_known) {
      n_new = 1;
    } else if (r->n_fed == n_known && r->n_pending > 0 &&
               r->last_sample_step_id == last_planned_step_ && last_step_seq_.count(r->id)) {
      n_new = 1;
      placeholder = true;
    } else {
      return false;
    }
    n_new = std::min(n_new, *budget_tokens);
    sample = true;
  }
  if (n_new <= 0) return false;
  const int32_t kv_len = r->n_fed + n_new;
  const bool penalties = has_penalties(r->sampling);
  if (n_slots_used_ + kv_len > limits.max_slots) return false;
  if (penalties && n_history_used_ + kv_len > limits.max_history) return false;
  if (allocator_.n_free() < n_new) return false;  // cannot happen with reservations

  const int32_t s = h.n_seqs;
  // Slots come out of the request's reservation.
  allocator_.unreserve(n_new);
  r->n_reserved -= n_new;
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
  std::copy(r->slots.begin(), r->slots.end(), view.slot_table.begin() + n_slots_used_);
  n_slots_used_ += kv_len;
  view.slot_start[static_cast<size_t>(s + 1)] = n_slots_used_;
  view.sample[static_cast<size_t>(s)] = sample ? 1 : 0;
  view.sampling[static_cast<size_t>(s)] = to_step_sampling(r->sampling);
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
  r->n_fed = kv_len;
  r->last_step_id = step_id;
  if (sample) {
    ++r->n_pending;
    r->last_sample_step_id = step_id;
  }
  *budget_tokens -= n_new;
  step->request_ids.push_back(r->id);
  step->sampled.push_back(sample ? 1 : 0);
  step->n_tokens += n_new;
  if (prefill) step->n_prefill_tokens += n_new;
  return true;
}

std::optional<PlannedStep> ContinuousBatcher::plan(uint64_t step_id, proto::StepView view,
                                                   const proto::StepRingLimits& limits,
                                                   std::vector<Request*>* rejected) {
  const int32_t max_seqs = std::min(options_.max_batch_seqs, limits.max_seqs);
  int32_t budget_tokens = std::min(options_.max_batch_tokens, limits.max_tokens);
  proto::StepHeader& h = *view.header;
  h = proto::StepHeader{};
  h.step_id = step_id;
  view.token_start[0] = 0;
  view.slot_start[0] = 0;
  view.history_start[0] = 0;
  n_slots_used_ = 0;
  n_history_used_ = 0;

  PlannedStep step;
  step.step_id = step_id;
  std::unordered_map<uint64_t, int32_t> seq_of;
  auto add = [&](Request* r) {
    if (h.n_seqs >= max_seqs || budget_tokens <= 0) return;
    if (add_sequence(r, step_id, view, limits, &budget_tokens, &step)) {
      if (step.sampled.back()) seq_of[r->id] = h.n_seqs - 1;
    }
  };
  for (Request* r : running_) add(r);

  // Admission, first come first served: the head waits until its whole length fits.
  while (!waiting_.empty() && h.n_seqs < max_seqs && budget_tokens > 0) {
    Request* r = waiting_.front();
    if (r->max_tokens == proto::kMaxTokensRestOfContext) {
      // "The rest of the context": what the model's context (capped by the pool) leaves
      // after the prompt; at least 1, so that a prompt that fills it is refused below.
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
    if (!why.empty()) {
      waiting_.pop_front();
      r->finish = RequestFinish::kError;
      r->state = RequestState::kFinished;
      rejected->push_back(r);
      continue;
    }
    if (!allocator_.reserve(need).is_ok()) break;
    waiting_.pop_front();
    r->n_reserved = need;
    r->state = RequestState::kRunning;
    running_.push_back(r);
    by_id_[r->id] = r;
    add(r);
  }

  if (h.n_seqs == 0) return std::nullopt;
  h.n_slots = n_slots_used_;
  h.n_history = n_history_used_;
  step.n_top_logits = h.n_top_logits;
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

void ContinuousBatcher::retire(Request* r) {
  if (r->state == RequestState::kWaiting) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  }
  if (by_id_.erase(r->id) > 0) {
    running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  }
  last_step_seq_.erase(r->id);
  allocator_.unreserve(r->n_reserved);
  r->n_reserved = 0;
  if (!r->slots.empty()) {
    if (r->last_step_id > last_completed_step_) {
      deferred_.push_back({r->last_step_id, std::move(r->slots)});
    } else {
      allocator_.release(r->slots);
    }
    r->slots.clear();
  }
  r->n_pending = 0;
  r->state = RequestState::kFinished;
}

void ContinuousBatcher::release_deferred() {
  auto done = [&](const DeferredRelease& d) { return d.step_id <= last_completed_step_; };
  for (const DeferredRelease& d : deferred_) {
    if (done(d)) allocator_.release(d.slots);
  }
  deferred_.erase(std::remove_if(deferred_.begin(), deferred_.end(), done), deferred_.end());
}

std::vector<Request*> ContinuousBatcher::drop_running() {
  std::vector<Request*> dropped = running_;
  for (Request* r : dropped) {
    r->slots.clear();  // the pool is gone with the worker
    retire(r);
  }
  deferred_.clear();
  last_step_seq_.clear();
  last_completed_step_ = last_planned_step_;
  return dropped;
}

}  // namespace litellama
