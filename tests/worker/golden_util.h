// Shared by the CPU and GPU golden tests: the Hugging Face reference files and requests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/worker/offline_engine.h"
#include "tests/worker/test_util.h"

namespace litellama::test {

namespace fs = std::filesystem;
using nlohmann::json;

inline std::vector<std::string> golden_presets() {
  return {"llama3-tiny",  "llama3-untied-tiny", "llama2-linear-tiny", "llama2-dynamic-tiny",
          "mistral-tiny", "qwen2-tiny",         "qwen2-yarn-tiny",    "qwen3-tiny"};
}

inline json load_golden(const std::string& preset) {
  const fs::path path = fs::path(test::source_dir()) / "tests/golden/models" / (preset + ".json");
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
