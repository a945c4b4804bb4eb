// The worker's side of a step-ring buffer (common/proto/step_ring.h): the step as a StepBatchView
// over the buffer itself, no copy. Token and history placeholders (< 0: the id the previous step
// sampled for its sequence -id - 1) are resolved in the buffer, which the worker owns while it
// runs the step; the slot-table epoch is checked against the steps seen before.
#pragma once

#include <cstdint>
#include <span>

#include "common/proto/step_ring.h"
#include "common/status.h"
#include "services/worker/model_runner.h"

namespace litellama {

class RingStepReader {
 public:
  // Reads `view` (a buffer of a ring with `limits`) into *batch, whose spans point into the
  // buffer and stay valid while the worker owns it. `previous` holds the previous step's sampled
  // ids. `registered`: the ring is registered with the runner (StepBatchView::registered).
  Status read(const proto::StepView& view, const proto::StepRingLimits& limits,
              std::span<const int32_t> previous, bool registered, StepBatchView* batch);
  // After a failed step: the runner's slot table may not hold what the scheduler believes, so
  // only a step that starts a new epoch is taken next.
  void invalidate() { epoch_ = 0; }
  uint32_t epoch() const { return epoch_; }

 private:
  uint32_t epoch_ = 0;  // 0: none
};

}  // namespace litellama
