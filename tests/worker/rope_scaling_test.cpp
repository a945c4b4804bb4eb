// RoPE tables: the closed forms of each scaling variant (the golden tests check them end to end
// against transformers; these pin the individual formulas and the dynamic-NTK switch point).
#include <cmath>

#include <gtest/gtest.h>

#include "services/worker/rope_scaling.h"

namespace litellama {
namespace {

ModelConfig config_with(RopeScalingType type, double factor) {
  ModelConfig c;
  c.head_dim = 64;
  c.rope.type = type;
  c.rope.theta = 10000.0;
  c.rope.factor = factor;
  c.rope.original_max_position_embeddings = 2048;
  c.max_position_embeddings = 2048;
  return c;
}

TEST(RopeScalingTest, DefaultAndLinear) {
  auto plain = rope_inv_freq(config_with(RopeScalingType::kDefault, 1.0), 10);
  ASSERT_EQ(plain.size(), 32u);
  EXPECT_FLOAT_EQ(plain[0], 1.0f);
  EXPECT_NEAR(plain[16], std::pow(10000.0, -0.5), 1e-7);
  auto linear = rope_inv_freq(config_with(RopeScalingType::kLinear, 4.0), 10);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_FLOAT_EQ(linear[i], plain[i] / 4.0f);
}

TEST(RopeScalingTest, DynamicGrowsTheBaseOnlyPastTheOriginalContext) {
  ModelConfig c = config_with(RopeScalingType::kDynamic, 2.0);
  EXPECT_EQ(rope_dynamic_base(c, 100), 10000.0);
  EXPECT_EQ(rope_dynamic_base(c, 2048), 10000.0);
  const double expected = 10000.0 * std::pow(2.0 * 4096 / 2048 - 1.0, 64.0 / 62.0);
  EXPECT_NEAR(rope_dynamic_base(c, 4096), expected, 1e-6 * expected);
  auto short_seq = rope_inv_freq(c, 10);
  auto long_seq = rope_inv_freq(c, 4096);
  EXPECT_FLOAT_EQ(short_seq[0], long_seq[0]);  // i = 0 is always 1
  EXPECT_LT(long_seq[20], short_seq[20]);
}

TEST(RopeScalingTest, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  ModelConfig c = config_with(RopeScalingType::kLlama3, 8.0);
  c.rope.theta = 500000.0;
  c.rope.original_max_position_embeddings = 8192;
  ModelConfig plain_cfg = c;
  plain_cfg.rope.type = RopeScalingType::kDefault;
  auto plain = rope_inv_freq(plain_cfg, 1);
  auto scaled = rope_inv_freq(c, 1);
  EXPECT_FLOAT_EQ(scaled[0], plain[0]);           // wavelength 2*pi: untouched
  EXPECT_FLOAT_EQ(scaled[31], plain[31] / 8.0f);  // longest wavelength: divided by factor
  EXPECT_FLOAT_EQ(rope_attention_scaling(c), 1.0f);
}

TEST(RopeScalingTest, YarnAttentionFactor) {
  ModelConfig c = config_with(RopeScalingType::kYarn, 4.0);
  EXPECT_NEAR(rope_attention_scaling(c), 0.1 * std::log(4.0) + 1.0, 1e-6);
  c.rope.attention_factor = 1.5;
  EXPECT_FLOAT_EQ(rope_attention_scaling(c), 1.5f);
  auto inv = rope_inv_freq(c, 1);
  ModelConfig plain_cfg = config_with(RopeScalingType::kDefault, 1.0);
  auto plain = rope_inv_freq(plain_cfg, 1);
  EXPECT_FLOAT_EQ(inv[0], plain[0]);              // extrapolated band
  EXPECT_NEAR(inv[31], plain[31] / 4.0f, 1e-12);  // interpolated band
}

}  // namespace
}  // namespace litellama
