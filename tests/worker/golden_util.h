// Shared by the CPU and GPU golden tests: the Hugging Face reference files and requests.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/offline_engine.h"
#include "tests/worker/test_util.h"

namespace litellama::test {

namespace fs = std::filesystem;
using nlohmann::json;

// The runner the CPU tests compare with their references: default options but for 512 KV slots
// and two threads.
inline Result<std::unique_ptr<ModelRunner>> reference_cpu_runner(const Checkpoint& checkpoint) {
  RunnerOptions options;
  options.n_kv_slots = 512;
  options.n_threads = 2;
  return create_model_runner(checkpoint, options);
}

// The presets with transformers references under tests/golden/models.
inline std::vector<std::string> golden_presets() {
  // The hd* presets cover the head sizes other than 64 and 128 (16 to 256) and GQA ratios from
  // 1 (MHA) to 7 on the general attention kernels.
  return {"llama3-tiny",  "llama3-untied-tiny", "llama2-linear-tiny", "llama2-dynamic-tiny",
          "mistral-tiny", "qwen2-tiny",         "qwen2-yarn-tiny",    "qwen3-tiny",
          "hd16-tiny",    "hd32-tiny",          "hd48-tiny",          "hd80-tiny",
          "hd96-tiny",    "hd256-tiny"};
}

// Tolerance of a 16-bit run against transformers in the same dtype, relative to the logit
// scale: both round every activation to 8 (bf16) or 11 (fp16) mantissa bits, in other places.
inline double half_precision_tolerance(const std::string& dtype_name) {
  return dtype_name == "bfloat16" ? 2e-2 : 3e-3;
}

// A case is decisive in a dtype when the reference's top-1/top-2 gap exceeds twice the tolerance:
// then no pair of errors within the tolerance can swap the two, so the first generated token must
// be the reference's.
inline bool decisive(const json& c, double tolerance) {
  const double scale = c["logit_scale"].get<double>();
  const double gap = c["top_logits"][0][1].get<double>() - c["top_logits"][1][1].get<double>();
  return gap > 2 * tolerance * scale;
}

// <preset>.json: float32 on the CPU; <preset>.<dtype>.json: transformers in that dtype on the GPU.
inline json load_golden(const std::string& preset, const std::string& dtype_name = "float32") {
  const std::string file =
      dtype_name == "float32" ? preset + ".json" : preset + "." + dtype_name + ".json";
  const fs::path path = fs::path(test::source_dir()) / "tests/golden/models" / file;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing golden file " << path
                         << " (LITELLAMA_SOURCE_DIR=" << test::source_dir() << ")";
  json j;
  if (in) in >> j;
  return j;
}

inline GenerationRequest request_for(const json& c) {
  GenerationRequest r;
  r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
  r.max_new_tokens = static_cast<int32_t>(c["greedy_ids"].size());
  r.n_top_logits = static_cast<int32_t>(c["top_logits"].size());
  return r;
}

// gtest parameter names: letters and digits only.
inline std::string preset_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (auto& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

}  // namespace litellama::test
