// The CUDA backend of ModelRunner: weights converted to the compute dtype (bf16, fp16 or fp32)
// and uploaded once, a per-layer token-attention KV pool, workspaces sized once from
// RunnerOptions, and one step = one host-to-device copy of the step's metadata, the layers,
// sampling on the device and one device-to-host copy of the sampled ids.
#pragma once

#include <memory>

#include "common/status.h"
#include "services/worker/model_runner.h"

namespace litellama {

class Checkpoint;

// Refuses (kUnsupported / kUnavailable / kResourceExhausted, with the reason) dtypes, shapes the
// kernels do not support, a missing device and a KV pool that would not fit.
Result<std::unique_ptr<ModelRunner>> create_cuda_model_runner(const Checkpoint& checkpoint,
                                                              const RunnerOptions& options);

}  // namespace litellama
