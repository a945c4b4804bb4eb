// Quantized checkpoints against Hugging Face transformers (float32): tests/golden/
// make_quant_model_golden.py quantized the llama3-tiny model (seed 7) with `litellama quantize
// --group-size 32` (awq and w8a8 calibrated over tests/golden/quant/calibration.txt), dequantized
// the result with its own numpy unpacker and ran transformers on the dense copy. Here the same two
// commands write the same quantized checkpoint, which the CPU backend loads as stored: greedy ids
// identical to transformers', top logits within 1e-3 of the logit scale.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/worker/golden_util.h"

namespace litellama {
namespace {

using test::json;

class QuantGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantGoldenTest, QuantizedCheckpointMatchesTransformersOnItsDequantizedWeights) {
  const std::string method = GetParam();
  const std::string dir = test::source_dir() + "/tests/golden/quant";
  std::ifstream in(dir + "/" + method + "-llama3-tiny.json");
  ASSERT_TRUE(in.good()) << "no golden for " << method;
  const json golden = json::parse(in);
  test::TempDir tmp;
  const test::CommandResult made = test::run_litellama(
      "make-model --preset llama3-tiny --seed " + std::to_string(golden["seed"].get<int>()) +
      " --dtype float32 --out " + tmp.sub("dense"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::string args = "quantize --method " + method + " --group-size " +
                     std::to_string(golden["group_size"].get<int>());
  if (!golden["calibration"].is_null()) {
    args += " --calibration " + dir +
            "/calibration.txt --calibration-tokens 512 --calibration-sequence-length 128";
  }
  const test::CommandResult quantized =
      test::run_litellama(args + " " + tmp.sub("dense") + " " + tmp.sub("q"));
  ASSERT_EQ(quantized.exit_code, 0) << quantized.output;

  auto ckpt = Checkpoint::open(tmp.sub("q"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  ASSERT_NE(ckpt->config().quant.method, QuantMethod::kNone);
  auto runner = test::reference_cpu_runner(*ckpt);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  OfflineEngine engine(**runner);
  ASSERT_EQ(golden["cases"].size(), 3u);
  for (const json& c : golden["cases"]) {
    const GenerationRequest request = test::request_for(c);
    SCOPED_TRACE(testing::Message() << method << ", prompt of " << request.prompt_ids.size());
    auto res = engine.generate({request});
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const GenerationResult& r = res->front();
    EXPECT_EQ(r.output_ids, c["greedy_ids"].get<std::vector<int32_t>>());
    const double scale = c["logit_scale"].get<double>();
    ASSERT_EQ(r.top_logits.size(), c["top_logits"].size());
    for (size_t i = 0; i < r.top_logits.size(); ++i) {
      EXPECT_EQ(r.top_logits[i].first, c["top_logits"][i][0].get<int32_t>()) << "rank " << i;
      EXPECT_NEAR(r.top_logits[i].second, c["top_logits"][i][1].get<double>(), 1e-3 * scale)
          << "rank " << i;
    }
  }
}

// The references make_quant_model_golden.py wrote, one per method.
INSTANTIATE_TEST_SUITE_P(Methods, QuantGoldenTest,
                         ::testing::Values("awq", "gptq-rtn", "fp8", "w8a8"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

}  // namespace
}  // namespace litellama
