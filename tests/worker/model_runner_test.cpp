// The CPU runner's KV-slot contract: where a sequence's tokens live in the pool does not change
// what it computes (slot tables scattered across a large pool), a long decode crosses many slots,
// a step mixing prefill and decode sequences matches running them apart, and bad batches are
// refused before anything is written.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include <gtest/gtest.h>

#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "tests/worker/table_deltas.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::make_model(tmp_.path(), "llama3-untied-tiny", 7);
    auto ckpt = Checkpoint::open(tmp_.path());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    ckpt_ = std::make_unique<Checkpoint>(std::move(ckpt).value());
    RunnerOptions options;
    options.n_kv_slots = 4096;
    options.n_threads = 2;
    auto runner = create_model_runner(*ckpt_, options);
    ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
    runner_ = std::move(runner).value();
  }

  // Greedy decode of `prompt` for n tokens, the i-th position stored in slots[i].
  std::vector<int32_t> decode(const std::vector<int32_t>& prompt, int32_t n,
                              const std::vector<int32_t>& slots) {
    std::vector<int32_t> out;
    StepBatch batch;
    StepOutput result;
    const auto n_prompt = static_cast<int32_t>(prompt.size());
    batch.add_sequence(prompt, std::span<const int32_t>(slots).first(n_prompt), true, {}, 0);
    EXPECT_TRUE(runner_->step(batch, &result).is_ok());
    out.push_back(result.sampled_ids[0]);
    for (int32_t i = 1; i < n; ++i) {
      batch.clear();
      const int32_t tok = out.back();
      batch.add_sequence(std::span<const int32_t>(&tok, 1),
                         std::span<const int32_t>(slots).first(static_cast<size_t>(n_prompt + i)),
                         true, {}, i);
      Status st = runner_->step(batch, &result);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      out.push_back(result.sampled_ids[0]);
    }
    return out;
  }

  test::TempDir tmp_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(RunnerTest, LongDecodeIsIndependentOfSlotPlacement) {
  const std::vector<int32_t> prompt = {5, 17, 123, 9000, 42, 77, 1000};
  const int32_t n = 300;
  std::vector<int32_t> contiguous(prompt.size() + n);
  std::iota(contiguous.begin(), contiguous.end(), 0);
  std::vector<int32_t> scattered(4096);
  std::iota(scattered.begin(), scattered.end(), 0);
  std::shuffle(scattered.begin(), scattered.end(), std::mt19937(3));
  scattered.resize(contiguous.size());
  const auto a = decode(prompt, n, contiguous);
  const auto b = decode(prompt, n, scattered);
  ASSERT_EQ(a.size(), static_cast<size_t>(n));
  EXPECT_EQ(a, b);
  // The decode is not degenerate: it produced several distinct tokens.
  std::vector<int32_t> distinct = a;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 5);
}

// The slot table the runner keeps: each sequence's table sent once, to a place of its own, then
// one new entry per step, decodes exactly as whole tables every step do.
TEST_F(RunnerTest, SlotTableDeltasMatchWholeTables) {
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 123, 9000, 42}, {7, 8, 9, 10, 11, 12, 13, 14, 15}, {300, 200, 100}};
  std::vector<int32_t> pool(4096);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(5));
  const int32_t n_steps = 24;
  std::vector<std::vector<int32_t>> slots;
  for (size_t s = 0; s < prompts.size(); ++s) {
    slots.emplace_back(pool.begin() + static_cast<std::ptrdiff_t>(s * 64),
                       pool.begin() + static_cast<std::ptrdiff_t>(s * 64 + 64));
  }
  const auto whole = test::decode_sequences(*runner_, prompts, slots, n_steps, false, {});
  const auto deltas =
      test::decode_sequences(*runner_, prompts, slots, n_steps, true, {3000, 40, 9000});
  ASSERT_EQ(whole.ids.size(), 3u);
  EXPECT_EQ(whole.ids, deltas.ids);
  ASSERT_EQ(whole.top.size(), deltas.top.size());
  for (size_t i = 0; i < whole.top.size(); ++i) EXPECT_EQ(whole.top[i], deltas.top[i]) << i;

  // A table outside the runner's is refused.
  StepBatch batch;
  batch.add_sequence(prompts[2], std::span<const int32_t>(slots[2]).first(3), true, {}, 0);
  StepBatchView view = batch.view();
  const std::vector<int32_t> far = {static_cast<int32_t>(runner_->slot_table_capacity()) - 2};
  view.slot_start = far;
  StepOutput out;
  const Status st = runner_->step(view, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("outside the slot table"), std::string::npos) << st.message();
}

TEST_F(RunnerTest, MixedPrefillAndDecodeStepMatchesSeparateSteps) {
  // Sequence A: prompt of 5 already in the cache, decodes its 6th token.
  // Sequence B: prefills 19 tokens in the same step. Compare with B alone in other slots.
  const std::vector<int32_t> a_prompt = {11, 22, 33, 44, 55};
  std::vector<int32_t> b_prompt(19);
  for (int32_t i = 0; i < 19; ++i) b_prompt[i] = 100 + 37 * i;
  std::vector<int32_t> a_slots = {900, 5, 17, 3000, 1, 2};
  std::vector<int32_t> b_slots(19), b_alone_slots(19);
  for (int32_t i = 0; i < 19; ++i) {
    b_slots[i] = 2000 + 3 * i;
    b_alone_slots[i] = 100 + i;
  }
  StepBatch batch;
  StepOutput out;
  batch.add_sequence(a_prompt, std::span<const int32_t>(a_slots).first(5), true, {}, 0);
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  const int32_t a_first = out.sampled_ids[0];

  batch.clear();
  batch.n_top_logits = 4;
  batch.add_sequence(std::span<const int32_t>(&a_first, 1), a_slots, true, {}, 1);
  batch.add_sequence(b_prompt, b_slots, true, {}, 0);
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  const StepOutput mixed = out;

  batch.clear();
  batch.n_top_logits = 4;
  batch.add_sequence(b_prompt, b_alone_slots, true, {}, 0);
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  EXPECT_EQ(mixed.sampled_ids[1], out.sampled_ids[0]);
  ASSERT_EQ(mixed.top_logits[1].size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(mixed.top_logits[1][k].first, out.top_logits[0][k].first);
    EXPECT_NEAR(mixed.top_logits[1][k].second, out.top_logits[0][k].second, 1e-4);
  }

  // A's decode inside the mixed step equals A decoded alone from the same cache.
  std::vector<int32_t> a_alone = decode(a_prompt, 2, {300, 301, 302, 303, 304, 305});
  EXPECT_EQ(mixed.sampled_ids[0], a_alone[1]);
}

TEST_F(RunnerTest, ChunkedPrefillMatchesOneShotPrefill) {
  std::vector<int32_t> prompt(40);
  for (int32_t i = 0; i < 40; ++i) prompt[i] = 7 + 311 * i;
  std::vector<int32_t> slots(40);
  std::iota(slots.begin(), slots.end(), 1000);
  StepBatch batch;
  StepOutput one_shot, chunked;
  batch.n_top_logits = 3;
  batch.add_sequence(prompt, slots, true, {}, 0);
  ASSERT_TRUE(runner_->step(batch, &one_shot).is_ok());
  std::vector<int32_t> slots2(40);
  std::iota(slots2.begin(), slots2.end(), 2000);
  // Chunks of 13, 13, 14: only the last samples.
  for (int32_t start = 0; start < 40; start += 13) {
    const int32_t n = std::min(13 + (start == 26 ? 1 : 0), 40 - start);
    batch.clear();
    batch.n_top_logits = 3;
    batch.add_sequence(std::span<const int32_t>(prompt).subspan(start, n),
                       std::span<const int32_t>(slots2).first(start + n), start + n == 40, {}, 0);
    ASSERT_TRUE(runner_->step(batch, &chunked).is_ok());
    if (start + n < 40) {
      EXPECT_EQ(chunked.sampled_ids[0], -1);
    }
  }
  EXPECT_EQ(chunked.sampled_ids[0], one_shot.sampled_ids[0]);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(chunked.top_logits[0][k].second, one_shot.top_logits[0][k].second, 1e-4);
  }
}

// Logprobs are the log-softmax of the raw logits: every sampled row's logprob and lse match a
// double-precision log-softmax of the runner's raw logits (all of them, as top logits) within
// 1e-5, whatever the row's temperature and penalties, also when the sampled id is one the
// penalties changed.
TEST_F(RunnerTest, LogprobsAreTheRawLogSoftmaxWhateverTheSampling) {
  const int32_t vocab = ckpt_->config().vocab_size;
  const std::vector<int32_t> prompt = {5, 17, 29, 41};
  StepBatch batch;
  StepOutput out;
  batch.n_top_logits = vocab;
  batch.logprobs = true;
  SamplingParams greedy;
  SamplingParams hot;
  hot.temperature = 1.7f;
  hot.top_k = 40;
  hot.repetition_penalty = 1.5f;
  hot.frequency_penalty = 0.7f;
  hot.seed = 3;
  int32_t slot = 0;
  auto add = [&](const SamplingParams& p, const std::vector<int32_t>& generated) {
    std::vector<int32_t> slots(prompt.size());
    std::iota(slots.begin(), slots.end(), slot);
    slot += static_cast<int32_t>(prompt.size());
    batch.add_sequence(prompt, slots, true, p, static_cast<int32_t>(generated.size()));
    batch.set_history(prompt, generated);
  };
  add(greedy, {});
  add(hot, {7, 7, 9});
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  const int32_t raw_argmax = out.top_logits[0][0].first;
  // A greedy row whose presence penalty (negative: a bonus) makes it pick an id of its history
  // that is not the raw argmax: its logprob must still be of the raw logit.
  const int32_t boosted = raw_argmax == 3 ? 4 : 3;
  SamplingParams bonus;
  bonus.presence_penalty = -1000.0f;
  add(bonus, {boosted});
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  EXPECT_EQ(out.sampled_ids[2], boosted);

  ASSERT_EQ(out.logprobs.size(), 3u);
  ASSERT_EQ(out.lse.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    ASSERT_EQ(out.top_logits[s].size(), static_cast<size_t>(vocab));
    std::vector<double> raw(static_cast<size_t>(vocab));
    for (const auto& [id, value] : out.top_logits[s]) raw[static_cast<size_t>(id)] = value;
    const double max = *std::max_element(raw.begin(), raw.end());
    double total = 0;
    for (double v : raw) total += std::exp(v - max);
    const double lse = max + std::log(total);
    EXPECT_NEAR(out.lse[s], lse, 1e-5) << s;
    const auto id = static_cast<size_t>(out.sampled_ids[s]);
    EXPECT_NEAR(out.logprobs[s], raw[id] - lse, 1e-5) << s;
    // The top list less lse is the logprob of those ids.
    EXPECT_NEAR(out.top_logits[s][0].second - out.lse[s], raw[out.top_logits[s][0].first] - lse,
                1e-5);
  }
  // Same prompt, so the same raw distribution, whatever each row's sampling.
  EXPECT_FLOAT_EQ(out.lse[0], out.lse[1]);
  EXPECT_FLOAT_EQ(out.lse[0], out.lse[2]);

  // Without the flag no logprobs are returned.
  batch.logprobs = false;
  ASSERT_TRUE(runner_->step(batch, &out).is_ok());
  EXPECT_TRUE(out.logprobs.empty());
}

TEST_F(RunnerTest, RefusesInvalidBatches) {
  StepOutput out;
  StepBatch empty;
  EXPECT_EQ(runner_->step(empty, &out).code(), StatusCode::kInvalidArgument);

  StepBatch bad_slot;
  const std::vector<int32_t> tokens = {1, 2};
  const std::vector<int32_t> slots = {0, 4096};
  bad_slot.add_sequence(tokens, slots, true, {}, 0);
  Status st = runner_->step(bad_slot, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("KV slot 4096 is outside the pool"), std::string::npos)
      << st.message();

  StepBatch bad_token;
  const std::vector<int32_t> big = {128256};
  const std::vector<int32_t> one_slot = {0};
  bad_token.add_sequence(big, one_slot, true, {}, 0);
  st = runner_->step(bad_token, &out);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();

  StepBatch long_table;  // more table entries than kv_len
  const std::vector<int32_t> three = {1, 2, 3};
  long_table.add_sequence(three, std::span<const int32_t>(three).first(3), true, {}, 0);
  long_table.slot_table.push_back(0);
  long_table.slot_start.back() += 1;
  st = runner_->step(long_table, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  StepBatch penalties_without_history;
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  penalties_without_history.add_sequence(tokens, std::vector<int32_t>{0, 1}, true, p, 0);
  st = runner_->step(penalties_without_history, &out);
  EXPECT_NE(st.message().find("no history"), std::string::npos) << st.message();
}

// Both GEMV token limits' defaults follow the model size; an explicit limit, 0 included, is kept.
TEST(RunnerOptionsTest, GemvTokenLimitsFollowModelSizeByDefault) {
  using Resolve = int32_t (*)(const RunnerOptions&, int32_t);
  for (const auto& [limit, resolve] :
       {std::pair<int32_t RunnerOptions::*, Resolve>{&RunnerOptions::gemv_max_tokens,
                                                     resolved_gemv_max_tokens},
        {&RunnerOptions::gemv_gate_up_max_tokens, resolved_gemv_gate_up_max_tokens}}) {
    RunnerOptions o;
    EXPECT_EQ(o.*limit, -1);
    EXPECT_EQ(resolve(o, 1536), 8);  // Qwen2.5-1.5B
    EXPECT_EQ(resolve(o, 2048), 8);  // Llama-3.2-1B
    EXPECT_EQ(resolve(o, 4096), 4);  // Llama-3.1-8B
    o.*limit = 0;
    EXPECT_EQ(resolve(o, 2048), 0);
    o.*limit = 2;
    EXPECT_EQ(resolve(o, 4096), 2);
    o.*limit = 8;
    EXPECT_EQ(resolve(o, 4096), 8);
  }
}

TEST(RunnerOptionsTest, LayerKernelRepeatsParse) {
  auto r = parse_layer_kernel_repeats("");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, LayerKernelRepeats{});
  r = parse_layer_kernel_repeats("qkv=2,attention=0,down=2");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, (LayerKernelRepeats{.qkv = 2, .attention = 0, .down = 2}));
  r = parse_layer_kernel_repeats("o=2,post_norm=0,gate_up=1");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, (LayerKernelRepeats{.o = 2, .post_norm = 0}));
  for (const char* bad : {"mlp=2", "qkv", "qkv=", "qkv=3", "qkv=-1", "qkv=22", "qkv=2,qkv=1",
                          ",qkv=2", "qkv=2,,o=2", "QKV=2"}) {
    SCOPED_TRACE(bad);
    auto b = parse_layer_kernel_repeats(bad);
    ASSERT_FALSE(b.is_ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(RunnerOptionsTest, ComputeDtypeAutoFollowsDeviceAndCheckpoint) {
  auto dt = [](Device d, const char* requested, DType ckpt) {
    auto r = resolve_compute_dtype(d, requested, ckpt);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : DType::kF32;
  };
  EXPECT_EQ(dt(Device::kCpu, "auto", DType::kBF16), DType::kF32);
  EXPECT_EQ(dt(Device::kCpu, "", DType::kF16), DType::kF32);
  EXPECT_EQ(dt(Device::kCuda, "auto", DType::kBF16), DType::kBF16);
  EXPECT_EQ(dt(Device::kCuda, "auto", DType::kF16), DType::kF16);
  EXPECT_EQ(dt(Device::kCuda, "auto", DType::kF32), DType::kBF16);
  EXPECT_EQ(dt(Device::kCuda, "", DType::kF32), DType::kBF16);
  EXPECT_EQ(dt(Device::kCuda, "float32", DType::kBF16), DType::kF32);
  EXPECT_EQ(dt(Device::kCuda, "float16", DType::kBF16), DType::kF16);
  EXPECT_EQ(dt(Device::kCpu, "bfloat16", DType::kF32), DType::kBF16);  // the CPU runner refuses it
  auto bad = resolve_compute_dtype(Device::kCuda, "fp8", DType::kBF16);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown dtype 'fp8'"), std::string::npos);
}

}  // namespace
}  // namespace litellama
