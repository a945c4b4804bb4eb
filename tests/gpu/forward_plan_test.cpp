// plan_forward (services/worker/cuda/forward_plan.h): the decisions a CUDA step follows, from the
// step's shape, the model and the options alone. Host code: no device needed.
#include "services/worker/cuda/forward_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

ModelConfig preset_config(const std::string& name) {
  auto preset = find_random_checkpoint_preset(name);
  EXPECT_TRUE(preset.is_ok()) << preset.status().message();
  nlohmann::json j = preset->config;
  j["torch_dtype"] = "bfloat16";
  auto c = parse_model_config(j);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return *c;
}

// n_decode sequences of one new token each (context `kv` each) and, when prefill_len > 0, one
// sequence of prefill_len new tokens; every sequence sampled, greedy unless `sampled`.
StepBatch make_batch(int32_t n_decode, int32_t kv, int32_t prefill_len, bool sampled) {
  StepBatch b;
  std::vector<int32_t> slots(static_cast<size_t>(kv + prefill_len));
  std::iota(slots.begin(), slots.end(), 0);
  SamplingParams p;
  if (sampled) p.temperature = 0.8f;
  const std::vector<int32_t> one{5};
  for (int32_t s = 0; s < n_decode; ++s) {
    b.add_sequence(one, std::span(slots.data(), static_cast<size_t>(kv)), true, p, 1);
  }
  if (prefill_len > 0) {
    const std::vector<int32_t> prompt(static_cast<size_t>(prefill_len), 7);
    b.add_sequence(prompt, std::span(slots.data(), static_cast<size_t>(prefill_len)), true, p, 0);
  }
  return b;
}

struct Fixture {
  ModelConfig config;
  RunnerOptions options;
  ForwardPlanContext ctx;
  explicit Fixture(const std::string& preset) : config(preset_config(preset)) {
    options.device = Device::kCuda;
    options.compute_dtype = DType::kBF16;
    options.gemv_max_tokens = resolved_gemv_max_tokens(options, config.hidden_size);
    options.gemv_gate_up_max_tokens = resolved_gemv_gate_up_max_tokens(options, config.hidden_size);
    ctx.config = &config;
    ctx.options = &options;
    ctx.dtype = DType::kBF16;
    ctx.n_sms = 132;
    ctx.input_norms_folded = true;
    ctx.graphs_available = true;
  }
  ForwardPlan plan(const StepBatch& b, int32_t n_top = 0) const {
    return plan_forward(plan_step(b, config), n_top, ctx);
  }
};

TEST(ForwardPlan, SmallDecodeStepsTakeTheGemvLayersAndAGraph) {
  Fixture f("llama3.2-1b");
  const ForwardPlan p = f.plan(make_batch(1, 100, 0, false));
  EXPECT_TRUE(p.gemv_layers);
  EXPECT_EQ(p.qkv, QkvPath::kFoldedNormGemvRope);
  EXPECT_TRUE(p.gate_up_gemv);
  EXPECT_FALSE(p.head_gathers);
  EXPECT_GT(p.attention_splits, 0);
  EXPECT_TRUE(p.greedy_sampler);
  EXPECT_TRUE(p.graph);
  // The key changes with what the launches depend on.
  EXPECT_NE(f.plan(make_batch(2, 100, 0, false)).graph_key, p.graph_key);
  EXPECT_NE(f.plan(make_batch(1, 100, 0, true)).graph_key, p.graph_key);
  EXPECT_NE(f.plan(make_batch(1, 100, 0, false), 4).graph_key, p.graph_key);
  EXPECT_EQ(f.plan(make_batch(1, 101, 0, false)).graph_key, p.graph_key);
  StepBatch with_logprobs = make_batch(1, 100, 0, false);
  with_logprobs.logprobs = true;
  const ForwardPlan lp = f.plan(with_logprobs);
  EXPECT_NE(lp.graph_key, p.graph_key);
  EXPECT_FALSE(lp.greedy_sampler);
  const std::string text = p.describe();
  EXPECT_NE(text.find("GEMV variants"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA graph"), std::string::npos) << text;

  f.ctx.input_norms_folded = false;
  EXPECT_EQ(f.plan(make_batch(1, 100, 0, false)).qkv, QkvPath::kNormThenGemvRope);
  f.ctx.graphs_available = false;
  EXPECT_FALSE(f.plan(make_batch(1, 100, 0, false)).graph);
}

TEST(ForwardPlan, LargeAndMixedStepsTakeGemmsEagerly) {
  Fixture f("llama3.2-1b");
  const ForwardPlan big = f.plan(make_batch(64, 100, 0, true));
  EXPECT_FALSE(big.gemv_layers);
  EXPECT_FALSE(big.qkv_gemv || big.o_gemv || big.gate_up_linear_gemv || big.down_gemv);
  EXPECT_FALSE(big.greedy_sampler);
  EXPECT_TRUE(big.graph);  // pure decode
  // A prefill mixed in: the head gathers the last rows and no graph runs.
  const ForwardPlan mixed = f.plan(make_batch(3, 100, 40, false));
  EXPECT_FALSE(mixed.gemv_layers);
  EXPECT_TRUE(mixed.head_gathers);
  EXPECT_FALSE(mixed.graph);
  EXPECT_NE(mixed.describe().find("gather"), std::string::npos);
  // gate/up leaves the GEMV above its own limit.
  f.options.gemv_gate_up_max_tokens = 2;
  const ForwardPlan four = f.plan(make_batch(4, 100, 0, false));
  EXPECT_TRUE(four.gemv_layers);
  EXPECT_FALSE(four.gate_up_gemv);
  f.options.gemv_max_tokens = 0;
  EXPECT_FALSE(f.plan(make_batch(1, 100, 0, false)).gemv_layers);
}

TEST(ForwardPlan, InputEmbeddingRowsAreScatteredAndNeverGraphed) {
  Fixture f("llama3.2-1b");
  StepBatch b = make_batch(1, 100, 0, false);
  const std::vector<float> rows(static_cast<size_t>(f.config.hidden_size));
  b.embed_token_index = {0};
  b.embed_rows = rows.data();
  b.embed_rows_memory = EmbeddingMemory::kDevice;
  const ForwardPlan p = f.plan(b);
  EXPECT_EQ(p.n_embed, 1);
  EXPECT_FALSE(p.graph);
  EXPECT_NE(p.describe().find("1 input embedding rows"), std::string::npos) << p.describe();
}

TEST(ForwardPlan, QkNormModelsRopeOutsideTheGemv) {
  Fixture f("qwen3-tiny");
  const ForwardPlan p = f.plan(make_batch(1, 10, 0, false));
  ASSERT_TRUE(p.gemv_layers);
  EXPECT_EQ(p.qkv, QkvPath::kLinearThenRope);
}

}  // namespace
}  // namespace litellama
