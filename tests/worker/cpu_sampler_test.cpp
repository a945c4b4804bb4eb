// Sampling semantics of the CPU sampler (the reference the device sampler is checked against).
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "services/worker/cpu_sampler.h"

namespace litellama {
namespace {

int32_t sample(std::vector<float> logits, const SamplingParams& p, int64_t n_generated = 0,
               std::vector<int32_t> prompt = {}, std::vector<int32_t> generated = {}) {
  SamplingInput in;
  in.prompt_ids = prompt;
  in.generated_ids = generated;
  in.n_generated = n_generated;
  return sample_token(logits, p, in);
}

TEST(CpuSamplerTest, GreedyPicksTheMaximumAndTheLowestIdOnTies) {
  SamplingParams p;
  EXPECT_EQ(sample({0.1f, 3.0f, -2.0f, 2.9f}, p), 1);
  EXPECT_EQ(sample({1.0f, 5.0f, 5.0f, 2.0f}, p), 1);
}

TEST(CpuSamplerTest, TopLogitsAreSortedWithTiesByLowerId) {
  const std::vector<float> logits = {1.0f, 7.0f, 3.0f, 7.0f, -1.0f};
  auto top = top_logits(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0], std::make_pair(1, 7.0f));
  EXPECT_EQ(top[1], std::make_pair(3, 7.0f));
  EXPECT_EQ(top[2], std::make_pair(2, 3.0f));
  EXPECT_EQ(top_logits(logits, 99).size(), logits.size());
}

TEST(CpuSamplerTest, SeededDrawsAreReproducibleAndVary) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  const std::vector<float> logits(50, 0.0f);  // uniform
  std::vector<int32_t> a, b;
  for (int i = 0; i < 40; ++i) {
    a.push_back(sample(logits, p, i));
    b.push_back(sample(logits, p, i));
  }
  EXPECT_EQ(a, b);
  std::map<int32_t, int> counts;
  for (int32_t id : a) ++counts[id];
  EXPECT_GT(counts.size(), 15u);  // 40 uniform draws over 50 ids hit many ids
  p.seed = 43;
  std::vector<int32_t> c;
  for (int i = 0; i < 40; ++i) c.push_back(sample(logits, p, i));
  EXPECT_NE(a, c);
}

// The top-p boundary falls inside a group of equal logits (ids 1, 2, 3): the whole group stays,
// so id 3 is drawn as often as id 1, and id 4 (below the group) never.
TEST(CpuSamplerTest, TopPKeepsTheWholeTieGroupAtItsBoundary) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // the largest (e^2 of e^2 + 3e + 1, about 0.45) does not reach it, id 1 does
  p.seed = 7;
  const std::vector<float> logits = {2.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  std::map<int32_t, int> counts;
  for (int i = 0; i < 4000; ++i) ++counts[sample(logits, p, i)];
  EXPECT_EQ(counts[4], 0);
  EXPECT_GT(counts[3], 400);  // each tied id has e / (e^2 + 3e), about 0.18 of the kept mass
  EXPECT_NEAR(counts[3], counts[1], 200);
}

TEST(CpuSamplerTest, TemperatureFollowsTheSoftmax) {
  // Two tokens with logits 0 and ln(3): probabilities 1/4 and 3/4 at temperature 1,
  // and (at temperature 2) 1/(1+sqrt 3) and sqrt 3/(1+sqrt 3).
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  for (float t : {1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 7;
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += sample(logits, p, i) == 1;
    const double expected = t == 1.0f ? 0.75 : std::sqrt(3.0) / (1 + std::sqrt(3.0));
    EXPECT_NEAR(static_cast<double>(ones) / n, expected, 0.015) << "temperature " << t;
  }
}

TEST(CpuSamplerTest, TopKTopPAndMinPRestrictTheCandidates) {
  const std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, -1.0f, 4.7f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  for (int i = 0; i < 300; ++i) {
    const int32_t id = sample(logits, p, i);
    ASSERT_TRUE(id == 0 || id == 1) << id;
  }
  p.top_k = 1;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(sample(logits, p, i), 0);

  SamplingParams q;
  q.temperature = 1.0f;
  q.top_p = 0.01f;  // only the most likely token is needed to pass 1%
  for (int i = 0; i < 50; ++i) ASSERT_EQ(sample(logits, q, i), 0);
  q.top_p = 0.5f;  // the top two cover > 50% of the four close ones
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) ++seen[sample(logits, q, i)];
  for (const auto& [id, count] : seen) EXPECT_TRUE(id <= 2) << id;

  SamplingParams m;
  m.temperature = 1.0f;
  m.min_p = 0.5f;  // ids 3 and 4 are far below half of the top probability
  for (int i = 0; i < 500; ++i) {
    const int32_t id = sample(logits, m, i);
    ASSERT_TRUE(id != 3 && id != 4) << id;
  }
}

TEST(CpuSamplerTest, Penalties) {
  SamplingParams rep;
  rep.repetition_penalty = 2.0f;
  // id 0 (logit 3) was in the prompt: 3/2 = 1.5 < 2.5, so id 1 wins.
  EXPECT_EQ(sample({3.0f, 2.5f, -1.0f}, rep, 0, {0}), 1);
  // A negative logit gets multiplied: -1 * 2 = -2 < -1.5.
  EXPECT_EQ(sample({-1.0f, -1.5f}, rep, 0, {0}), 1);

  SamplingParams freq;
  freq.frequency_penalty = 0.5f;
  // id 0 generated three times: 3 - 1.5 = 1.5 < 2.
  EXPECT_EQ(sample({3.0f, 2.0f}, freq, 3, {}, {0, 0, 0}), 1);
  // Prompt tokens do not count for the frequency penalty.
  EXPECT_EQ(sample({3.0f, 2.0f}, freq, 0, {0, 0, 0}, {}), 0);

  SamplingParams presence;
  presence.presence_penalty = 1.1f;
  EXPECT_EQ(sample({3.0f, 2.0f}, presence, 1, {}, {0}), 1);
}

TEST(CpuSamplerTest, UniformDrawIsInRange) {
  for (int64_t i = 0; i < 10000; ++i) {
    const double u = sampling_uniform(99, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace litellama
