// Random checkpoints in Hugging Face layout, generated deterministically from a seed: the
// embedded default model, the test models (with real vocabulary sizes) and the benchmark shapes.
// Every element is a pure function of (seed, tensor name, index), so the same checkpoint comes
// out on any machine and the tests regenerate their models instead of committing weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/status.h"

namespace litellama {

struct RandomCheckpointPreset {
  std::string name;
  std::string description;
  nlohmann::json config;  // config.json as written (torch_dtype filled in at write time)
  std::string tokenizer;  // assets/tokenizers/<tokenizer> to copy beside it, or empty
};

// All presets, in a fixed order.
const std::vector<RandomCheckpointPreset>& random_checkpoint_presets();
Result<RandomCheckpointPreset> find_random_checkpoint_preset(const std::string& name);

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  DType storage_dtype = DType::kF32;
  int32_t n_shards = 1;       // > 1 writes model-0000i-of-0000n.safetensors + index
  std::string tokenizer_dir;  // copy tokenizer.json / tokenizer_config.json from here if set
  // > 0: the decoder layers' projections as symmetric 4-bit GPTQ in groups of this many input
  // rows (random codes, one scale per group that spans the dense initializer's range), for
  // benchmarks of the 4-bit kernels; embeddings, norms and the LM head stay dense.
  int32_t int4_group = 0;
  // The decoder layers' projections as compressed-tensors FP8 (random e4m3 codes, one scale per
  // output channel that maps the largest code onto the dense initializer's range, activations
  // quantized per token), for benchmarks of the FP8 kernels. Excludes int4_group.
  bool fp8 = false;
};

// Writes config.json and the safetensors file(s) for `config` into `dir` (created if missing).
Status write_random_checkpoint(const std::string& dir, nlohmann::json config,
                               const RandomCheckpointOptions& options);

// The value of element `index` of tensor `name` before scaling: uniform in [-1, 1).
float random_checkpoint_unit(uint64_t seed, const std::string& name, uint64_t index);

}  // namespace litellama
