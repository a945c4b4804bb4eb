// The CPU engine against Hugging Face transformers (float32) on every test architecture and
// RoPE variant: greedy ids identical, top logits within 1e-3 of the logit scale; the same prompts
// alone and packed together in one batch of mixed lengths give identical outputs.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/worker/golden_util.h"

namespace litellama {
namespace {

using test::json;
using test::load_golden;
using test::request_for;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformersAloneAndBatched) {
  const std::string preset = GetParam();
  const json golden = load_golden(preset);
  ASSERT_TRUE(golden.contains("cases"));
  test::TempDir tmp;
  test::make_model(tmp.path(), preset, golden["seed"].get<uint64_t>());
  auto ckpt = Checkpoint::open(tmp.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->config().arch_name, golden["architecture"].get<std::string>());
  auto runner = test::reference_cpu_runner(*ckpt);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  OfflineEngine engine(**runner);

  std::vector<GenerationRequest> requests;
  std::vector<GenerationResult> alone;
  for (const json& c : golden["cases"]) {
    requests.push_back(request_for(c));
    auto res = engine.generate({requests.back()});
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const GenerationResult& r = res->front();
    const auto expected_ids = c["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(r.output_ids, expected_ids)
        << preset << ", prompt of " << requests.back().prompt_ids.size() << " tokens";
    const double scale = c["logit_scale"].get<double>();
    ASSERT_EQ(r.top_logits.size(), c["top_logits"].size());
    for (size_t i = 0; i < r.top_logits.size(); ++i) {
      const int32_t id = c["top_logits"][i][0].get<int32_t>();
      const double value = c["top_logits"][i][1].get<double>();
      EXPECT_EQ(r.top_logits[i].first, id) << preset << " top logit " << i;
      EXPECT_NEAR(r.top_logits[i].second, value, 1e-3 * scale) << preset << " top logit " << i;
      EXPECT_TRUE(std::isfinite(r.top_logits[i].second));
    }
    alone.push_back(r);
  }
  // All prompts (lengths 1, 7, 67) in one packed batch, prefill then decode together.
  auto together = engine.generate(requests);
  ASSERT_TRUE(together.is_ok()) << together.status().to_string();
  ASSERT_EQ(together->size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ((*together)[i].output_ids, alone[i].output_ids) << preset << " request " << i;
    ASSERT_EQ((*together)[i].top_logits.size(), alone[i].top_logits.size());
    for (size_t k = 0; k < alone[i].top_logits.size(); ++k) {
      EXPECT_EQ((*together)[i].top_logits[k].first, alone[i].top_logits[k].first);
      EXPECT_NEAR((*together)[i].top_logits[k].second, alone[i].top_logits[k].second,
                  1e-5 * std::abs(alone[i].top_logits[k].second) + 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GoldenTest, ::testing::ValuesIn(test::golden_presets()),
                         test::preset_test_name);

// The 16-bit references exist for every preset, were made from the float32 file's prompts, and
// are decisive often enough that the GPU test's first-token check means something: at least 20
// of every 24 cases (make_golden.py picks the prompts for it).
TEST(GoldenReferences, HalfPrecisionReferencesAreDecisive) {
  for (const char* dtype_name : {"bfloat16", "float16"}) {
    const double tolerance = test::half_precision_tolerance(dtype_name);
    size_t n_cases = 0, n_decisive = 0;
    for (const std::string& preset : test::golden_presets()) {
      const json fp32 = load_golden(preset);
      const json half = load_golden(preset, dtype_name);
      ASSERT_TRUE(half.contains("cases")) << preset << " " << dtype_name;
      EXPECT_EQ(half["dtype"].get<std::string>(), dtype_name);
      ASSERT_EQ(half["cases"].size(), fp32["cases"].size()) << preset;
      for (size_t i = 0; i < half["cases"].size(); ++i) {
        const json& c = half["cases"][i];
        EXPECT_EQ(c["prompt_ids"], fp32["cases"][i]["prompt_ids"]) << preset << " case " << i;
        ASSERT_GE(c["top_logits"].size(), 2u);
        ++n_cases;
        if (test::decisive(c, tolerance)) ++n_decisive;
      }
    }
    EXPECT_GE(n_decisive * 24, n_cases * 20)
        << dtype_name << ": " << n_decisive << " of " << n_cases << " cases decisive";
  }
}

}  // namespace
}  // namespace litellama
