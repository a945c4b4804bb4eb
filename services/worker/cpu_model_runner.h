// The CPU backend: float32 math over upcast weights, OpenMP across output features and heads.
// It is the reference the CUDA backend and the served path are tested against, and the backend of
// machines without a GPU.
#pragma once

#include <memory>

#include "common/status.h"
#include "services/worker/model_runner.h"

namespace litellama {

Result<std::unique_ptr<ModelRunner>> create_cpu_model_runner(const Checkpoint& checkpoint,
                                                             const RunnerOptions& options);

}  // namespace litellama
