// The CUDA backend against Hugging Face transformers: in float32, greedy ids identical and top
// logits within 1e-3 of the logit scale, alone and batched; in bfloat16 and float16, against the
// float32 reference (top logit within the 16-bit tolerance, the reference's top id among ours) and
// against transformers run in that dtype (top logits within the tolerance, the first token equal
// on every decisive case).

#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "kernels/gpu_runtime.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/worker/golden_util.h"

namespace litellama {
namespace {

using test::json;

bool have_cuda_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class GoldenGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    golden_ = test::load_golden(GetParam());
    ASSERT_TRUE(golden_.contains("cases"));
    test::make_model(tmp_.path(), GetParam(), golden_["seed"].get<uint64_t>());
    auto ckpt = Checkpoint::open(tmp_.path());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    ckpt_ = std::make_unique<Checkpoint>(std::move(ckpt).value());
  }

  std::unique_ptr<ModelRunner> make_runner(DType dtype) {
    RunnerOptions options;
    options.device = Device::kCuda;
    options.compute_dtype = dtype;
    options.n_kv_slots = 1024;
    options.max_batch_tokens = 512;
    options.max_batch_seqs = 16;
    auto runner = create_model_runner(*ckpt_, options);
    EXPECT_TRUE(runner.is_ok()) << runner.status().to_string();
    return runner.is_ok() ? std::move(runner).value() : nullptr;
  }

  // Runs each case alone for one generated token on a runner of `dtype`, then
  // check(case, request, result). A failed check skips the rest of that case only.
  template <typename Check>
  void check_first_steps(DType dtype, const json& cases, Check&& check) {
    auto runner = make_runner(dtype);
    ASSERT_TRUE(runner);
    OfflineEngine engine(*runner);
    for (const json& c : cases) {
      GenerationRequest req = test::request_for(c);
      req.max_new_tokens = 1;
      auto res = engine.generate({req});
      ASSERT_TRUE(res.is_ok()) << res.status().to_string();
      check(c, req, res->front());
    }
  }

  test::TempDir tmp_;
  json golden_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_P(GoldenGpuTest, Float32MatchesTransformersAloneAndBatched) {
  auto runner = make_runner(DType::kF32);
  ASSERT_TRUE(runner);
  OfflineEngine engine(*runner);
  std::vector<GenerationRequest> requests;
  std::vector<GenerationResult> alone;
  for (const json& c : golden_["cases"]) {
    requests.push_back(test::request_for(c));
    auto res = engine.generate({requests.back()});
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const GenerationResult& r = res->front();
    EXPECT_EQ(r.output_ids, c["greedy_ids"].get<std::vector<int32_t>>())
        << GetParam() << ", prompt of " << requests.back().prompt_ids.size() << " tokens";
    const double scale = c["logit_scale"].get<double>();
    ASSERT_EQ(r.top_logits.size(), c["top_logits"].size());
    for (size_t i = 0; i < r.top_logits.size(); ++i) {
      EXPECT_EQ(r.top_logits[i].first, c["top_logits"][i][0].get<int32_t>());
      EXPECT_NEAR(r.top_logits[i].second, c["top_logits"][i][1].get<double>(), 1e-3 * scale);
    }
    alone.push_back(r);
  }
  auto together = engine.generate(requests);
  ASSERT_TRUE(together.is_ok()) << together.status().to_string();
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ((*together)[i].output_ids, alone[i].output_ids) << "request " << i;
    for (size_t k = 0; k < alone[i].top_logits.size(); ++k) {
      EXPECT_EQ((*together)[i].top_logits[k].first, alone[i].top_logits[k].first);
      EXPECT_NEAR((*together)[i].top_logits[k].second, alone[i].top_logits[k].second,
                  1e-5 * std::abs(alone[i].top_logits[k].second) + 1e-6);
    }
  }
}

TEST_P(GoldenGpuTest, HalfPrecisionTopLogitsWithinTolerance) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    // Relative to the logit scale: bf16 keeps 8 mantissa bits, fp16 11.
    const double tolerance = dtype == DType::kBF16 ? 3e-2 : 5e-3;
    check_first_steps(
        dtype, golden_["cases"],
        [&](const json& c, const GenerationRequest&, const GenerationResult& result) {
          const auto& top = result.top_logits;
          ASSERT_FALSE(top.empty());
          const double scale = c["logit_scale"].get<double>();
          EXPECT_NEAR(top[0].second, c["top_logits"][0][1].get<double>(), tolerance * scale)
              << GetParam() << " " << dtype_torch_name(dtype);
          const int32_t ref_top = c["top_logits"][0][0].get<int32_t>();
          bool found = false;
          for (const auto& [id, value] : top) {
            found = found || id == ref_top;
            EXPECT_TRUE(std::isfinite(value));
          }
          EXPECT_TRUE(found) << GetParam() << " " << dtype_torch_name(dtype)
                             << ": reference top id " << ref_top << " not in our top "
                             << top.size();
        });
  }
}

// Against transformers run in the same 16-bit dtype on the GPU: the first position's top logits
// rank by rank within the dtype's tolerance (the k-th largest logit moves no more than the largest
// error of any logit), and the first generated token equal to the reference's wherever the case is
// decisive.
TEST_P(GoldenGpuTest, HalfPrecisionMatchesTransformersInThatDtype) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string name = dtype_torch_name(dtype);
    const json golden = test::load_golden(GetParam(), name);
    ASSERT_TRUE(golden.contains("cases")) << GetParam() << " " << name;
    ASSERT_EQ(golden["cases"].size(), golden_["cases"].size());
    const double tolerance = test::half_precision_tolerance(name);
    double worst = 0;
    int n_decisive = 0;
    check_first_steps(
        dtype, golden["cases"],
        [&](const json& c, const GenerationRequest& req, const GenerationResult& result) {
          const auto& top = result.top_logits;
          ASSERT_EQ(top.size(), c["top_logits"].size());
          const double scale = c["logit_scale"].get<double>();
          for (size_t i = 0; i < top.size(); ++i) {
            const double diff = std::fabs(top[i].second - c["top_logits"][i][1].get<double>());
            worst = std::max(worst, diff / scale);
            EXPECT_LE(diff, tolerance * scale) << GetParam() << " " << name << " rank " << i;
          }
          if (test::decisive(c, tolerance)) {
            ++n_decisive;
            EXPECT_EQ(result.output_ids.at(0), c["greedy_ids"][0].get<int32_t>())
                << GetParam() << " " << name << ": decisive case, prompt of "
                << req.prompt_ids.size() << " tokens";
          }
        });
    std::printf(
        "[ %s ] %s vs transformers %s: largest top-logit error %.4f of the scale "
        "(tolerance %.4f), %d of %zu cases decisive\n",
        GetParam().c_str(), name.c_str(), name.c_str(), worst, tolerance, n_decisive,
        golden["cases"].size());
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GoldenGpuTest, ::testing::ValuesIn(test::golden_presets()),
                         test::preset_test_name);

}  // namespace
}  // namespace litellama
