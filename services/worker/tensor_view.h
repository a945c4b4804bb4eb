// TensorView: one tensor of a memory-mapped checkpoint, as stored (dtype, shape, bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "services/worker/safetensors.h"

namespace litellama {

struct TensorView : TensorMeta {
  const void* data = nullptr;  // inside the mapping; valid while the Checkpoint lives
  size_t size_bytes = 0;
  int32_t shard = 0;  // index of the file that holds it (Checkpoint::shard_bytes)

  int64_t numel() const;
  // Copies into float32 (upcasting bf16/fp16).
  std::vector<float> to_f32() const;
};

}  // namespace litellama
