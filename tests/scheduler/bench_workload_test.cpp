// `litellama bench`'s request streams (cli/bench_workloads.h): lengths and the multi-turn history.
#include "cli/bench_workloads.h"

#include <gtest/gtest.h>

#include <set>

namespace litellama::cli {
namespace {

WorkloadOptions multi_turn(double range_ratio) {
  WorkloadOptions o;
  o.kind = "multi-turn";
  o.conversations = 16;
  o.turns = 3;
  o.question_len = 40;
  o.output_len = 20;
  o.range_ratio = range_ratio;
  o.seed = 5;
  return o;
}

// Each turn sends the turn before, its answer and a new question; with a range ratio below 1 the
// question and answer lengths spread over [ratio * len, len], with 1 they are fixed.
TEST(BenchWorkload, MultiTurnLengthsFollowTheRangeRatioAndTurnsExtendTheHistory) {
  for (const double ratio : {1.0, 0.5}) {
    auto w = Workload::create(multi_turn(ratio), 1000);
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    std::set<size_t> question_lengths;
    std::set<int32_t> answer_lengths;
    std::vector<proto::GenerateRequest> turn = w->initial();
    ASSERT_EQ(turn.size(), 16u);
    EXPECT_EQ(w->total_requests(), 48);
    size_t index = 0;
    for (int t = 0; t < 3; ++t) {
      std::vector<proto::GenerateRequest> next;
      for (const proto::GenerateRequest& r : turn) {
        answer_lengths.insert(r.max_tokens);
        EXPECT_GE(r.max_tokens, ratio < 1.0 ? 10 : 20);
        EXPECT_LE(r.max_tokens, 20);
        // A made-up answer of the length asked for.
        const std::vector<int32_t> answer(static_cast<size_t>(r.max_tokens), 7);
        auto f = w->follow_up(index++, answer);
        if (t == 2) {
          EXPECT_FALSE(f.has_value());
          continue;
        }
        ASSERT_TRUE(f.has_value());
        ASSERT_GT(f->prompt_ids.size(), r.prompt_ids.size() + answer.size());
        EXPECT_TRUE(std::equal(r.prompt_ids.begin(), r.prompt_ids.end(), f->prompt_ids.begin()));
        EXPECT_TRUE(
            std::equal(answer.begin(), answer.end(),
                       f->prompt_ids.begin() + static_cast<ptrdiff_t>(r.prompt_ids.size())));
        const size_t question = f->prompt_ids.size() - r.prompt_ids.size() - answer.size();
        question_lengths.insert(question);
        EXPECT_GE(question, ratio < 1.0 ? 20u : 40u);
        EXPECT_LE(question, 40u);
        next.push_back(*f);
      }
      turn = std::move(next);
    }
    if (ratio < 1.0) {
      EXPECT_GT(question_lengths.size(), 4u);
      EXPECT_GT(answer_lengths.size(), 4u);
    } else {
      EXPECT_EQ(question_lengths.size(), 1u);
      EXPECT_EQ(answer_lengths.size(), 1u);
    }
  }
}

// The random workload's prompt and output lengths obey the same ratio.
TEST(BenchWorkload, RandomLengthsStayInTheirRange) {
  WorkloadOptions o;
  o.n_requests = 200;
  o.input_len = 100;
  o.output_len = 30;
  o.range_ratio = 0.25;
  auto w = Workload::create(o, 1000);
  ASSERT_TRUE(w.is_ok());
  std::set<size_t> lengths;
  for (const proto::GenerateRequest& r : w->initial()) {
    EXPECT_GE(r.prompt_ids.size(), 25u);
    EXPECT_LE(r.prompt_ids.size(), 100u);
    EXPECT_GE(r.max_tokens, 8);
    EXPECT_LE(r.max_tokens, 30);
    for (int32_t id : r.prompt_ids) ASSERT_TRUE(id >= 0 && id < 1000);
    lengths.insert(r.prompt_ids.size());
  }
  EXPECT_GT(lengths.size(), 20u);
}

}  // namespace
}  // namespace litellama::cli
