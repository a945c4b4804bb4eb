#include "services/worker/ring_step.h"

namespace litellama {

namespace {

Status resolve(std::span<int32_t> ids, std::span<const int32_t> previous) {
  for (int32_t& id : ids) {
    if (id >= 0) continue;
    const int64_t j = -static_cast<int64_t>(id) - 1;
    if (j >= static_cast<int64_t>(previous.size()) || previous[static_cast<size_t>(j)] < 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "placeholder for sequence {} of the previous step, which sampled nothing",
                        j);
    }
    id = previous[static_cast<size_t>(j)];
  }
  return Status::ok();
}

Status check_header(const proto::StepHeader& h, const proto::StepRingLimits& limits) {
  if (h.n_seqs <= 0 || h.n_seqs > limits.max_seqs || h.n_tokens <= 0 ||
      h.n_tokens > limits.max_tokens || h.n_new_slots < 0 || h.n_new_slots > limits.max_slots ||
      h.n_history < 0 || h.n_history > limits.max_history || h.n_top_logits < 0 ||
      h.n_top_logits > proto::kMaxStepTopLogits || (h.logprobs != 0 && h.logprobs != 1) ||
      h.table_epoch == 0 || (h.epoch_start != 0 && h.epoch_start != 1)) {
    return make_error(StatusCode::kInvalidArgument, "step header out of range");
  }
  return Status::ok();
}

}  // namespace

Status RingStepReader::read(const proto::StepView& view, const proto::StepRingLimits& limits,
                            std::span<const int32_t> previous, bool registered,
                            StepBatchView* batch) {
  const proto::StepHeader h = *view.header;
  LITELLAMA_RETURN_IF_ERROR(check_header(h, limits));
  const auto n_seqs = static_cast<size_t>(h.n_seqs);
  const auto n_tokens = static_cast<size_t>(h.n_tokens);
  StepBatchView& b = *batch;
  b = StepBatchView{};
  b.token_ids = view.token_ids.first(n_tokens);
  b.positions = view.positions.first(n_tokens);
  b.token_start = view.token_start.first(n_seqs + 1);
  b.kv_len = view.kv_len.first(n_seqs);
  b.slot_start = view.slot_start.first(n_seqs);
  b.new_slot_start = view.new_slot_start.first(n_seqs + 1);
  b.new_slots = view.new_slots.first(static_cast<size_t>(h.n_new_slots));
  b.sample = view.sample.first(n_seqs);
  b.sampling = view.sampling.first(n_seqs);
  b.n_generated = view.n_generated.first(n_seqs);
  if (h.n_history > 0) {
    b.history_start = view.history_start.first(n_seqs + 1);
    b.history_ids = view.history_ids.first(static_cast<size_t>(h.n_history));
    b.n_prompt = view.n_prompt.first(n_seqs);
    LITELLAMA_RETURN_IF_ERROR(resolve(view.history_ids.first(b.history_ids.size()), previous));
  }
  b.n_top_logits = h.n_top_logits;
  b.logprobs = h.logprobs == 1;
  b.registered = registered;
  LITELLAMA_RETURN_IF_ERROR(resolve(view.token_ids.first(n_tokens), previous));
  if (h.epoch_start == 1) {
    // The runner's table is rebuilt from this step alone: every sequence brings all of it.
    if (b.new_slot_start[0] != 0) {
      return make_error(StatusCode::kInvalidArgument, "step offsets do not cover the new slots");
    }
    for (size_t s = 0; s < n_seqs; ++s) {
      if (b.new_slot_start[s + 1] - b.new_slot_start[s] != b.kv_len[s]) {
        return make_error(StatusCode::kInvalidArgument,
                          "sequence {} of a step that starts table epoch {} brings {} of its {} "
                          "table entries",
                          s, h.table_epoch, b.new_slot_start[s + 1] - b.new_slot_start[s],
                          b.kv_len[s]);
      }
    }
    epoch_ = h.table_epoch;
  } else if (h.table_epoch != epoch_) {
    return make_error(StatusCode::kInvalidArgument,
                      "step of slot-table epoch {}, but the worker's table is of epoch {} (0: "
                      "none since it started or a step failed)",
                      h.table_epoch, epoch_);
  }
  return Status::ok();
}

}  // namespace litellama
