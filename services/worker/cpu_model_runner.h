// The CPU backend: float32 math over upcast weights, OpenMP across output features and heads.
// It is the reference the CUDA backend and the served path are tested against, and the backend of
// machines without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"
#include "services/worker/model_runner.h"

namespace litellama {

Result<std::unique_ptr<ModelRunner>> create_cpu_model_runner(const Checkpoint& checkpoint,
                                                             const RunnerOptions& options);

// The input of a decoder layer's projections: q/k/v (the input norm's output), o_proj (the
// attention output), gate/up (the post-attention norm's output), down_proj (SiLU(gate) * up).
enum class ProjectionInput { kQkv, kO, kGateUp, kDown };

// Sees every projection input of every layer during a step: `rows` x `dim` float32, row-major.
using ActivationObserver = std::function<void(int32_t layer, ProjectionInput input, const float* x,
                                              int64_t rows, int64_t dim)>;

// A CPU runner that shows its projection inputs to `observer`: the calibration pass of
// `litellama quantize` (activation statistics for AWQ and SmoothQuant).
Result<std::unique_ptr<ModelRunner>> create_observed_cpu_model_runner(const Checkpoint& checkpoint,
                                                                      const RunnerOptions& options,
                                                                      ActivationObserver observer);

}  // namespace litellama
