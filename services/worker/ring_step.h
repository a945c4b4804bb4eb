// The worker's side of a step-ring buffer (common/proto/step_ring.h): the step as a StepBatchView
// over the buffer itself, no copy. Token and history placeholders (< 0: the id the previous step
// sampled for its sequence -id - 1) are resolved in the buffer, which the worker owns while it
// runs the step; the slot-table epoch is checked against the steps seen before.
//
// Images: a step whose header has n_images > 0 names, per sequence, slots of the vision process's
// EmbeddingPool whose rows replace the embeddings of the image's positions. The reader opens that
// pool (by the header's name and incarnation, again whenever either changes) and keeps it mapped;
// each token whose position an image covers becomes an embedded token whose row is read in place
// from the mapping (StepBatchView::embed_row_index into the pool's rows). A pool on a device is
// mapped through the runner (DeviceEmbeddingMapper, CUDA IPC) and unmapped through it when
// another pool replaces it or the reader goes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/proto/step_ring.h"
#include "common/status.h"
#include "services/vision/embedding_pool.h"
#include "services/worker/model_runner.h"

namespace litellama {

class RingStepReader {
 public:
  // Reads no images: a step with images is refused.
  RingStepReader() = default;
  // hidden_size: the model's hidden size (ModelConfig::hidden_size), which the rows of an
  // embedding pool must have. mapper: maps device pools (the runner; null: host pools only); it
  // must outlive the reader.
  explicit RingStepReader(int32_t hidden_size, DeviceEmbeddingMapper* mapper = nullptr)
      : hidden_size_(hidden_size), mapper_(mapper) {}
  ~RingStepReader() { close_pool(); }
  RingStepReader(RingStepReader&& o) noexcept { *this = std::move(o); }
  RingStepReader& operator=(RingStepReader&& o) noexcept;

  // Reads `view` (a buffer of a ring with `limits`) into *batch, whose spans point into the
  // buffer and stay valid while the worker owns it. `previous` holds the previous step's sampled
  // ids. `registered`: the ring is registered with the runner (StepBatchView::registered).
  // With images, batch->embed_token_index / embed_row_index point into this reader and
  // batch->embed_rows into its pool's mapping: both stay valid until the next read() or the
  // reader's destruction. Every image entry is checked (counts, offsets, slots, the pool's
  // geometry against the header and the model), so an error here leaves nothing to read out of
  // bounds later.
  Status read(const proto::StepView& view, const proto::StepRingLimits& limits,
              std::span<const int32_t> previous, bool registered, StepBatchView* batch);
  // After a failed step: the runner's slot table may not hold what the scheduler believes, so
  // only a step that starts a new epoch is taken next.
  void invalidate() { epoch_ = 0; }
  uint32_t epoch() const { return epoch_; }
  // The embedding pool open now (the last one a step with images named), or null.
  const EmbeddingPool* pool() const { return pool_.get(); }

 private:
  // Fills the batch's embedding fields from the header's image entries (n_images > 0).
  Status read_images(const proto::StepView& view, const proto::StepHeader& h,
                     const proto::StepRingLimits& limits, StepBatchView* batch);
  // Makes pool_ the pool the header names, opening it unless it is open already.
  Status open_pool(const proto::StepHeader& h);
  // Drops pool_ (and its device mapping).
  void close_pool();

  uint32_t epoch_ = 0;  // 0: none
  int32_t hidden_size_ = 0;
  DeviceEmbeddingMapper* mapper_ = nullptr;
  std::unique_ptr<EmbeddingPool> pool_;
  const float* device_rows_ = nullptr;      // pool_'s rows mapped by mapper_ (device pools)
  std::vector<int32_t> embed_token_index_;  // the last step's, which its batch points into
  std::vector<int32_t> embed_row_index_;
};

}  // namespace litellama
