// The worker's read of a step-ring buffer: the step as a view over the buffer itself, token and
// history placeholders resolved in place, and the slot-table epochs (a step of an epoch the
// worker has not seen start, or after a failed step, is refused; an epoch's first step must bring
// every sequence's whole table).
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "common/proto/step_ring.h"
#include "services/worker/ring_step.h"

namespace litellama {
namespace {

class RingStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ring =
        proto::StepRing::create("litellama-test-ring-step-" + std::to_string(getpid()), limits_);
    ASSERT_TRUE(ring.is_ok()) << ring.status().to_string();
    ring_ = std::move(ring).value();
    view_ = ring_->buffer(1);
  }

  // Two sequences decoding one token each: kv_len 3 and 2, tables at 10 and 20, with `n_new`
  // new table entries each (whole tables: 3 and 2).
  void write(uint32_t epoch, bool start, int32_t n_new_a, int32_t n_new_b) {
    proto::StepHeader& h = *view_.header;
    h = proto::StepHeader{};
    h.n_seqs = 2;
    h.n_tokens = 2;
    h.table_epoch = epoch;
    h.epoch_start = start ? 1 : 0;
    const int32_t kv[2] = {3, 2};
    const int32_t n_new[2] = {n_new_a, n_new_b};
    view_.token_start[0] = 0;
    view_.new_slot_start[0] = 0;
    for (int s = 0; s < 2; ++s) {
      view_.token_ids[s] = -(s + 1);  // what the previous step sampled
      view_.positions[s] = kv[s] - 1;
      view_.token_start[s + 1] = s + 1;
      view_.kv_len[s] = kv[s];
      view_.slot_start[s] = 10 * (s + 1);
      for (int32_t i = 0; i < n_new[s]; ++i) view_.new_slots[h.n_new_slots++] = 100 * s + i;
      view_.new_slot_start[s + 1] = h.n_new_slots;
      view_.sample[s] = 1;
      view_.sampling[s] = SamplingParams{};
      view_.n_generated[s] = 1;
    }
  }

  proto::StepRingLimits limits_{16, 4, 64, 16, 256};
  std::unique_ptr<proto::StepRing> ring_;
  proto::StepView view_;
  RingStepReader reader_;
  const std::vector<int32_t> previous_ = {41, 42};
};

TEST_F(RingStepTest, ReadsTheBufferInPlaceAndResolvesPlaceholdersThere) {
  write(3, true, 3, 2);
  StepBatchView b;
  ASSERT_TRUE(reader_.read(view_, limits_, previous_, true, &b).is_ok());
  EXPECT_EQ(b.token_ids.data(), view_.token_ids.data());
  EXPECT_EQ(b.new_slots.data(), view_.new_slots.data());
  EXPECT_EQ(b.new_slots.size(), 5u);
  EXPECT_EQ(view_.token_ids[0], 41);
  EXPECT_EQ(view_.token_ids[1], 42);
  EXPECT_EQ(b.slot_start[1], 20);
  EXPECT_TRUE(b.registered);
  EXPECT_EQ(reader_.epoch(), 3u);
  EXPECT_TRUE(b.validate(1000, 100, limits_.table_capacity).is_ok());

  // The epoch's later steps bring their new entries alone.
  write(3, false, 1, 1);
  ASSERT_TRUE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  EXPECT_EQ(b.new_slots.size(), 2u);
  EXPECT_TRUE(b.validate(1000, 100, limits_.table_capacity).is_ok());
}

TEST_F(RingStepTest, RefusesStepsOfAnEpochThatDidNotStart) {
  StepBatchView b;
  write(1, false, 1, 1);  // nothing started yet
  Status st = reader_.read(view_, limits_, previous_, false, &b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("epoch"), std::string::npos) << st.message();

  write(1, true, 3, 1);  // an epoch's first step without B's whole table
  st = reader_.read(view_, limits_, previous_, false, &b);
  EXPECT_NE(st.message().find("brings 1 of its 2 table entries"), std::string::npos)
      << st.message();

  write(2, true, 3, 2);
  ASSERT_TRUE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  write(1, false, 1, 1);  // an older epoch
  EXPECT_FALSE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  reader_.invalidate();  // a step failed
  write(2, false, 1, 1);
  EXPECT_FALSE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  write(3, true, 3, 2);
  EXPECT_TRUE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
}

TEST_F(RingStepTest, RefusesHeadersAndPlaceholdersOutOfRange) {
  StepBatchView b;
  write(1, true, 3, 2);
  view_.header->n_new_slots = limits_.max_slots + 1;
  EXPECT_FALSE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  write(0, true, 3, 2);  // epoch 0 is never a valid epoch
  EXPECT_FALSE(reader_.read(view_, limits_, previous_, false, &b).is_ok());
  write(1, true, 3, 2);
  const std::vector<int32_t> one = {7};  // the previous step had one sequence
  const Status st = reader_.read(view_, limits_, one, false, &b);
  EXPECT_NE(st.message().find("placeholder for sequence 1"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace litellama
