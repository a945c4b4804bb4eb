#include "services/worker/ring_step.h"

#include <climits>
#include <cstring>
#include <string>
#include <string_view>

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
      h.table_epoch == 0 || (h.epoch_start != 0 && h.epoch_start != 1) || h.n_images < 0) {
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
  if (h.n_images > 0) LITELLAMA_RETURN_IF_ERROR(read_images(view, h, limits, &b));
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

RingStepReader& RingStepReader::operator=(RingStepReader&& o) noexcept {
  if (this == &o) return *this;
  close_pool();
  epoch_ = std::exchange(o.epoch_, 0);
  hidden_size_ = o.hidden_size_;
  mapper_ = o.mapper_;
  pool_ = std::move(o.pool_);
  device_rows_ = std::exchange(o.device_rows_, nullptr);
  embed_token_index_ = std::move(o.embed_token_index_);
  embed_row_index_ = std::move(o.embed_row_index_);
  return *this;
}

void RingStepReader::close_pool() {
  if (device_rows_ != nullptr && mapper_ != nullptr) mapper_->unmap_device_embeddings(device_rows_);
  device_rows_ = nullptr;
  pool_.reset();
}

Status RingStepReader::open_pool(const proto::StepHeader& h) {
  const size_t length = strnlen(h.vision_pool, proto::kVisionPoolNameBytes);
  if (length == proto::kVisionPoolNameBytes) {
    return make_error(StatusCode::kInvalidArgument,
                      "step's embedding pool name is not NUL-terminated within {} bytes",
                      proto::kVisionPoolNameBytes);
  }
  if (length == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "step has {} images but names no embedding pool", h.n_images);
  }
  // 0 would let open() take a pool of any vision process, whose slot numbering is not the one the
  // scheduler assigned; a vision process's incarnation is never 0.
  if (h.vision_incarnation == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "step has {} images but names no vision incarnation", h.n_images);
  }
  const std::string_view name(h.vision_pool, length);
  if (pool_ && pool_->name() == name && pool_->incarnation() == h.vision_incarnation) {
    return Status::ok();
  }
  // Another pool (a new vision process): the old mapping goes first, so that a pool that cannot
  // be opened or does not fit leaves none open, and every step naming it tries again.
  close_pool();
  auto opened = EmbeddingPool::open(std::string(name), h.vision_incarnation);
  if (!opened.is_ok()) {
    return Status(opened.status().code(),
                  "cannot open the step's embedding pool: " + opened.status().message());
  }
  std::unique_ptr<EmbeddingPool> pool = std::move(opened).value();
  const EmbeddingPoolGeometry& g = pool->geometry();
  if (g.hidden != hidden_size_) {
    return make_error(StatusCode::kInvalidArgument,
                      "embedding pool '{}' has rows of {} floats, the model's hidden size is {}",
                      pool->name(), g.hidden, hidden_size_);
  }
  // Row indices travel as int32 (StepBatchView::embed_row_index).
  if (pool->row_index(g.n_slots - 1, g.rows_per_slot - 1) > INT32_MAX) {
    return make_error(StatusCode::kUnsupported,
                      "embedding pool '{}' has more rows than an int32 row index reaches",
                      pool->name());
  }
  if (pool->on_device()) {
    if (mapper_ == nullptr) {
      return make_error(StatusCode::kUnsupported,
                        "embedding pool '{}' is in device memory; this worker reads host pools",
                        pool->name());
    }
    auto mapped = mapper_->map_device_embeddings(pool->device(), EmbeddingPool::rows_bytes(g));
    if (!mapped.is_ok()) {
      return Status(mapped.status().code(), fmt::format("embedding pool '{}': {}", pool->name(),
                                                        mapped.status().message()));
    }
    device_rows_ = *mapped;
  }
  pool_ = std::move(pool);
  return Status::ok();
}

Status RingStepReader::read_images(const proto::StepView& view, const proto::StepHeader& h,
                                   const proto::StepRingLimits& limits, StepBatchView* batch) {
  if (h.n_images > limits.max_images) {
    return make_error(StatusCode::kInvalidArgument,
                      "step has {} images, above the ring's capacity of {}", h.n_images,
                      limits.max_images);
  }
  if (hidden_size_ <= 0) {
    return make_error(StatusCode::kUnsupported,
                      "step has {} images but this reader takes none (no model hidden size)",
                      h.n_images);
  }
  LITELLAMA_RETURN_IF_ERROR(open_pool(h));
  const EmbeddingPoolGeometry& g = pool_->geometry();
  if (h.image_rows != g.rows_per_slot) {
    return make_error(StatusCode::kInvalidArgument,
                      "step's images have {} rows, the slots of embedding pool '{}' hold {}",
                      h.image_rows, pool_->name(), g.rows_per_slot);
  }
  // Offsets are checked here, not left to StepBatchView::validate, since they index the arrays
  // below before it runs.
  const int32_t n_seqs = h.n_seqs;
  const std::span<const int32_t> token_start = view.token_start.first(n_seqs + 1);
  const std::span<const int32_t> image_start = view.image_start.first(n_seqs + 1);
  if (image_start[0] != 0 || image_start[n_seqs] != h.n_images) {
    return make_error(StatusCode::kInvalidArgument,
                      "step's image offsets run from {} to {}, not 0 to its {} images",
                      image_start[0], image_start[n_seqs], h.n_images);
  }
  for (int32_t s = 0; s < n_seqs; ++s) {
    if (image_start[s + 1] < image_start[s]) {
      return make_error(StatusCode::kInvalidArgument, "sequence {}: image offsets decrease", s);
    }
    if (token_start[s] < 0 || token_start[s + 1] < token_start[s] ||
        token_start[s + 1] > h.n_tokens) {
      return make_error(StatusCode::kInvalidArgument, "sequence {}: token offsets out of range", s);
    }
  }
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t i = image_start[s]; i < image_start[s + 1]; ++i) {
      const int32_t slot = view.image_slot[static_cast<size_t>(i)];
      if (slot < 0 || slot >= g.n_slots) {
        return make_error(StatusCode::kInvalidArgument,
                          "sequence {}: image {} is in slot {}, outside embedding pool '{}' ({} "
                          "slots)",
                          s, i, slot, pool_->name(), g.n_slots);
      }
      if (view.image_pos[static_cast<size_t>(i)] < 0) {
        return make_error(StatusCode::kInvalidArgument,
                          "sequence {}: image {} starts at position {}", s, i,
                          view.image_pos[static_cast<size_t>(i)]);
      }
    }
  }
  // Tokens in packed order, so embed_token_index is strictly increasing. Each token is compared
  // with its own sequence's images only (a handful); a position two images cover is refused.
  embed_token_index_.clear();
  embed_row_index_.clear();
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t t = token_start[s]; t < token_start[s + 1]; ++t) {
      const int64_t p = view.positions[static_cast<size_t>(t)];
      int64_t row = -1;
      for (int32_t i = image_start[s]; i < image_start[s + 1]; ++i) {
        const int64_t first = view.image_pos[static_cast<size_t>(i)];
        if (p < first || p >= first + h.image_rows) continue;
        if (row >= 0) {
          return make_error(StatusCode::kInvalidArgument,
                            "sequence {}: position {} lies in two of its images", s, p);
        }
        row = pool_->row_index(view.image_slot[static_cast<size_t>(i)],
                               static_cast<int32_t>(p - first));
      }
      if (row < 0) continue;
      embed_token_index_.push_back(t);
      embed_row_index_.push_back(static_cast<int32_t>(row));  // fits: checked in open_pool
    }
  }
  if (embed_token_index_.empty()) return Status::ok();  // no token of this step is an image's
  StepBatchView& b = *batch;
  b.embed_token_index = embed_token_index_;
  b.embed_row_index = embed_row_index_;
  if (pool_->on_device()) {
    b.embed_rows = device_rows_;
    b.embed_rows_memory = EmbeddingMemory::kDevice;
  } else {
    b.embed_rows = pool_->rows(0).data();
    b.embed_rows_memory = EmbeddingMemory::kHost;
  }
  return Status::ok();
}

}  // namespace litellama
