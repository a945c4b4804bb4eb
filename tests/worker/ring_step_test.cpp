// The worker's read of a step-ring buffer: the step as a view over the buffer itself, token and
// history placeholders resolved in place, and the slot-table epochs (a step of an epoch the
// worker has not seen start, or after a failed step, is refused; an epoch's first step must bring
// every sequence's whole table). Images: the tokens an image covers (also when a prefill chunk
// covers only part of it) become embedded tokens whose rows are read in place from a real
// EmbeddingPool (a device pool's rows through the runner's mapping), and every malformed image
// entry fails the read with a message.
#include <unistd.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/proto/step_ring.h"
#include "services/vision/embedding_pool.h"
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

  proto::StepRingLimits limits_{16, 4, 64, 16, 256, 8};
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

// ---- Images ------------------------------------------------------------------------------------

// An image is one of kImageRows rows of kHidden floats in a 3-slot pool. kHidden 6 makes the pool
// pad each slot to 8 rows (the fewest whole rows that fill 64 bytes), so slots are not
// rows_per_slot apart: the reader must take row indices from the pool.
constexpr int32_t kHidden = 6;
constexpr int32_t kImageRows = 5;
constexpr uint64_t kVisionIncarnation = 77;

struct Image {
  int32_t slot;
  int32_t pos;
};

class RingStepImageTest : public RingStepTest {
 protected:
  void SetUp() override {
    RingStepTest::SetUp();
    pool_name_ = "litellama-test-ring-step-pool-" + std::to_string(getpid());
    auto pool = EmbeddingPool::create(pool_name_, {3, kImageRows, kHidden}, kVisionIncarnation);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
    for (int32_t slot = 0; slot < 3; ++slot) {
      std::span<float> rows = pool_->rows(slot);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = value(slot, static_cast<int32_t>(i));
    }
  }

  static float value(int32_t slot, int32_t i) { return static_cast<float>(1000 * slot + i); }

  // A prefill step of two sequences: A's chunk is positions 0..5 (kv_len 6), B's 4..9 (kv_len
  // 10); whole tables, so every step starts its epoch. images[s] are sequence s's entries.
  void write_images(const std::vector<std::vector<Image>>& images) {
    proto::StepHeader& h = *view_.header;
    h = proto::StepHeader{};
    h.n_seqs = 2;
    h.table_epoch = 1;
    h.epoch_start = 1;
    const int32_t kv[2] = {6, 10};
    view_.token_start[0] = 0;
    view_.new_slot_start[0] = 0;
    view_.image_start[0] = 0;
    for (int s = 0; s < 2; ++s) {
      for (int32_t p = kv[s] - 6; p < kv[s]; ++p) {
        view_.token_ids[static_cast<size_t>(h.n_tokens)] = 7;
        view_.positions[static_cast<size_t>(h.n_tokens++)] = p;
      }
      view_.token_start[s + 1] = h.n_tokens;
      view_.kv_len[s] = kv[s];
      view_.slot_start[s] = 20 * s;
      for (int32_t i = 0; i < kv[s]; ++i) view_.new_slots[h.n_new_slots++] = 100 * s + i;
      view_.new_slot_start[s + 1] = h.n_new_slots;
      view_.sample[s] = 1;
      view_.sampling[s] = SamplingParams{};
      view_.n_generated[s] = 0;
      for (const Image& image : images[static_cast<size_t>(s)]) {
        view_.image_slot[static_cast<size_t>(h.n_images)] = image.slot;
        view_.image_pos[static_cast<size_t>(h.n_images++)] = image.pos;
      }
      view_.image_start[s + 1] = h.n_images;
    }
    h.image_rows = kImageRows;
    h.vision_incarnation = kVisionIncarnation;
    std::snprintf(h.vision_pool, sizeof(h.vision_pool), "%s", pool_name_.c_str());
  }

  // A: one image at positions 2..6 in slot 2, of which the chunk covers 2..5 (its last row comes
  // with the next chunk). B: an image at 1..5 in slot 0 (the chunk covers 4 and 5), one at 7..11
  // in slot 1 (covers 7..9) and one at 20..24 the chunk does not reach.
  void write_two_sequences() { write_images({{{2, 2}}, {{0, 1}, {1, 7}, {0, 20}}}); }

  Status read(StepBatchView* b) { return reader_.read(view_, limits_, previous_, false, b); }

  // The read fails with `code` and a message containing `what`.
  void expect_error(StatusCode code, const std::string& what) {
    StepBatchView b;
    const Status st = read(&b);
    ASSERT_FALSE(st.is_ok()) << "expected: " << what;
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  }

  std::string pool_name_;
  std::unique_ptr<EmbeddingPool> pool_;
};

TEST_F(RingStepImageTest, CoveredPositionsTakeTheirPoolRowsInPlace) {
  reader_ = RingStepReader(kHidden);
  write_two_sequences();
  StepBatchView b;
  const Status st = read(&b);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // A's tokens 2..5 are its image's rows 0..3; B's tokens (packed from 6, positions 4..9) at
  // positions 4, 5 are rows 3, 4 of slot 0 and at 7, 8, 9 rows 0..2 of slot 1.
  const std::vector<int32_t> tokens = {2, 3, 4, 5, 6, 7, 9, 10, 11};
  const std::vector<std::pair<int32_t, int32_t>> slot_rows = {
      {2, 0}, {2, 1}, {2, 2}, {2, 3}, {0, 3}, {0, 4}, {1, 0}, {1, 1}, {1, 2}};
  EXPECT_EQ(std::vector<int32_t>(b.embed_token_index.begin(), b.embed_token_index.end()), tokens);
  ASSERT_EQ(b.embed_row_index.size(), slot_rows.size());
  // The rows lie in the reader's own mapping of the region the test's pool created.
  EXPECT_EQ(b.embed_rows_memory, EmbeddingMemory::kHost);
  const EmbeddingPool* mapped = reader_.pool();
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->incarnation(), kVisionIncarnation);
  EXPECT_EQ(b.embed_rows, mapped->rows(0).data());
  for (size_t j = 0; j < slot_rows.size(); ++j) {
    const auto [slot, row] = slot_rows[j];
    SCOPED_TRACE(j);
    EXPECT_EQ(b.embed_row_index[j], pool_->row_index(slot, row));
    EXPECT_EQ(b.embed_row_index[j], slot * 8 + row);  // slots padded to 8 rows of 6 floats
    const float* got = b.embed_rows + static_cast<int64_t>(b.embed_row_index[j]) * kHidden;
    for (int32_t i = 0; i < kHidden; ++i) ASSERT_EQ(got[i], value(slot, row * kHidden + i));
  }
  EXPECT_TRUE(b.validate(1000, 100, limits_.table_capacity).is_ok());

  // A later step of the same pool keeps the mapping; its rows follow writes to the pool.
  pool_->rows(1)[0] = -3.0f;
  ASSERT_TRUE(read(&b).is_ok());
  EXPECT_EQ(reader_.pool(), mapped);
  EXPECT_EQ(b.embed_rows[static_cast<int64_t>(b.embed_row_index[6]) * kHidden], -3.0f);
}

TEST_F(RingStepImageTest, NoImagesOrNoneCoveredLeaveTheEmbeddingFieldsEmpty) {
  reader_ = RingStepReader(kHidden);
  write_images({{}, {}});
  StepBatchView b;
  ASSERT_TRUE(read(&b).is_ok());
  EXPECT_TRUE(b.embed_token_index.empty());
  EXPECT_TRUE(b.embed_row_index.empty());
  EXPECT_EQ(b.embed_rows, nullptr);
  EXPECT_EQ(reader_.pool(), nullptr);  // nothing named a pool

  // Images the step's tokens do not reach (before A's chunk, after B's).
  write_images({{{0, 6}}, {{1, 10}}});
  ASSERT_TRUE(read(&b).is_ok());
  EXPECT_TRUE(b.embed_token_index.empty());
  EXPECT_TRUE(b.embed_row_index.empty());
  EXPECT_EQ(b.embed_rows, nullptr);

  // A reader without a model hidden size still reads steps without images.
  RingStepReader plain;
  write_images({{}, {}});
  EXPECT_TRUE(plain.read(view_, limits_, previous_, false, &b).is_ok());
}

TEST_F(RingStepImageTest, ANewIncarnationOpensTheNewPool) {
  reader_ = RingStepReader(kHidden);
  write_two_sequences();
  StepBatchView b;
  ASSERT_TRUE(read(&b).is_ok());
  // The vision process restarted: a new pool (here also a new name) with new rows.
  const std::string other_name = pool_name_ + "-b";
  auto other = EmbeddingPool::create(other_name, {3, kImageRows, kHidden}, kVisionIncarnation + 1);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  (*other)->rows(2)[0] = 42.0f;
  write_two_sequences();
  view_.header->vision_incarnation = kVisionIncarnation + 1;
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s", other_name.c_str());
  ASSERT_TRUE(read(&b).is_ok());
  ASSERT_NE(reader_.pool(), nullptr);
  EXPECT_EQ(reader_.pool()->incarnation(), kVisionIncarnation + 1);
  EXPECT_EQ(b.embed_rows[0 + static_cast<int64_t>(b.embed_row_index[0]) * kHidden], 42.0f);
  // The same name with another incarnation than the region's: refused, nothing left open.
  write_two_sequences();
  view_.header->vision_incarnation = kVisionIncarnation + 5;
  expect_error(StatusCode::kUnavailable, "incarnation");
  EXPECT_EQ(reader_.pool(), nullptr);
}

// Maps a device pool's rows as a device runner would, into host memory the test can read; counts
// maps and unmaps.
class FakeMapper : public DeviceEmbeddingMapper {
 public:
  Result<const float*> map_device_embeddings(const EmbeddingPoolDevice& pool,
                                             uint64_t bytes) override {
    if (fail) return make_error(StatusCode::kUnavailable, "the exporter is gone");
    handles.push_back(pool.ipc_handle);
    buffers.emplace_back(bytes / sizeof(float), static_cast<float>(buffers.size() + 1));
    ++n_mapped;
    return buffers.back().data();
  }
  void unmap_device_embeddings(const float* rows) override { unmapped.push_back(rows); }
  bool fail = false;
  int n_mapped = 0;
  std::vector<std::array<uint8_t, 64>> handles;
  std::vector<std::vector<float>> buffers;
  std::vector<const float*> unmapped;
};

EmbeddingPoolDevice device_export(uint8_t tag) {
  EmbeddingPoolDevice d;
  for (size_t i = 0; i < d.ipc_handle.size(); ++i) d.ipc_handle[i] = static_cast<uint8_t>(tag + i);
  for (size_t i = 0; i < d.device_uuid.size(); ++i) d.device_uuid[i] = static_cast<uint8_t>(i);
  return d;
}

TEST_F(RingStepImageTest, ADevicePoolIsMappedThroughTheRunnerOnceAndUnmappedWhenReplaced) {
  FakeMapper mapper;
  // The vision process's pool on a device: the region holds the header and the export only.
  const std::string device_name = pool_name_ + "-dev";
  const EmbeddingPoolDevice first = device_export(1);
  auto pool =
      EmbeddingPool::create(device_name, {3, kImageRows, kHidden}, kVisionIncarnation + 1, &first);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  {
    RingStepReader reader(kHidden, &mapper);
    reader_ = std::move(reader);
  }
  EXPECT_EQ(mapper.unmapped.size(), 0u);  // the moved-from reader held nothing
  write_two_sequences();
  view_.header->vision_incarnation = kVisionIncarnation + 1;
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s", device_name.c_str());
  StepBatchView b;
  ASSERT_TRUE(read(&b).is_ok());
  ASSERT_EQ(mapper.n_mapped, 1);
  EXPECT_EQ(mapper.handles[0], first.ipc_handle);
  EXPECT_EQ(mapper.buffers[0].size() * sizeof(float),
            EmbeddingPool::rows_bytes({3, kImageRows, kHidden}));
  EXPECT_EQ(b.embed_rows_memory, EmbeddingMemory::kDevice);
  EXPECT_EQ(b.embed_rows, mapper.buffers[0].data());
  ASSERT_EQ(b.embed_row_index.size(), 9u);
  EXPECT_EQ(b.embed_row_index[0], (*pool)->row_index(2, 0));  // same numbering as a host pool
  // The same pool again: no second map.
  ASSERT_TRUE(read(&b).is_ok());
  EXPECT_EQ(mapper.n_mapped, 1);
  // A new vision process: the old rows are unmapped before the new ones are mapped.
  const std::string next_name = pool_name_ + "-dev2";
  const EmbeddingPoolDevice second = device_export(9);
  auto next =
      EmbeddingPool::create(next_name, {3, kImageRows, kHidden}, kVisionIncarnation + 2, &second);
  ASSERT_TRUE(next.is_ok());
  view_.header->vision_incarnation = kVisionIncarnation + 2;
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s", next_name.c_str());
  ASSERT_TRUE(read(&b).is_ok());
  ASSERT_EQ(mapper.unmapped.size(), 1u);
  EXPECT_EQ(mapper.unmapped[0], mapper.buffers[0].data());
  ASSERT_EQ(mapper.n_mapped, 2);
  EXPECT_EQ(mapper.handles[1], second.ipc_handle);
  EXPECT_EQ(b.embed_rows, mapper.buffers[1].data());
  // A map that fails leaves nothing open, with the pool's name in the message.
  const std::string third_name = pool_name_ + "-dev3";
  auto third =
      EmbeddingPool::create(third_name, {3, kImageRows, kHidden}, kVisionIncarnation + 3, &first);
  ASSERT_TRUE(third.is_ok());
  mapper.fail = true;
  view_.header->vision_incarnation = kVisionIncarnation + 3;
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s", third_name.c_str());
  expect_error(StatusCode::kUnavailable, third_name);
  EXPECT_EQ(reader_.pool(), nullptr);
  EXPECT_EQ(mapper.unmapped.size(), 2u);
  // The reader's end unmaps what it holds.
  mapper.fail = false;
  ASSERT_TRUE(read(&b).is_ok());
  reader_ = RingStepReader();
  EXPECT_EQ(mapper.unmapped.size(), 3u);
  EXPECT_EQ(mapper.unmapped.back(), mapper.buffers.back().data());
}

TEST_F(RingStepImageTest, ADevicePoolWithoutAMapperIsRefused) {
  reader_ = RingStepReader(kHidden);
  const std::string device_name = pool_name_ + "-dev";
  const EmbeddingPoolDevice d = device_export(3);
  auto pool = EmbeddingPool::create(device_name, {3, kImageRows, kHidden}, kVisionIncarnation, &d);
  ASSERT_TRUE(pool.is_ok());
  write_two_sequences();
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s", device_name.c_str());
  expect_error(StatusCode::kUnsupported, "device memory");
}

TEST_F(RingStepImageTest, RefusesMalformedImageEntries) {
  reader_ = RingStepReader(kHidden);
  write_two_sequences();
  view_.header->n_images = limits_.max_images + 1;
  view_.image_start[2] = view_.header->n_images;
  expect_error(StatusCode::kInvalidArgument, "above the ring's capacity of 8");
  write_two_sequences();
  view_.header->n_images = -1;
  expect_error(StatusCode::kInvalidArgument, "step header out of range");

  write_two_sequences();
  view_.image_start[1] = 3;  // A: 0..3, B: 3..2
  view_.image_start[2] = 2;
  expect_error(StatusCode::kInvalidArgument, "image offsets");
  write_two_sequences();
  view_.image_start[1] = 2;  // A takes B's first; monotonic but B's last is dropped
  view_.image_start[2] = 3;
  expect_error(StatusCode::kInvalidArgument, "not 0 to its 4 images");
  write_two_sequences();
  view_.image_start[0] = 1;
  expect_error(StatusCode::kInvalidArgument, "not 0 to its 4 images");
  write_two_sequences();
  view_.image_start[1] = 5;  // past n_images, then back
  expect_error(StatusCode::kInvalidArgument, "sequence 1: image offsets decrease");

  write_two_sequences();
  view_.token_start[1] = 20;  // past the step's tokens
  expect_error(StatusCode::kInvalidArgument, "sequence 0: token offsets out of range");

  for (int32_t slot : {3, -1}) {
    write_two_sequences();
    view_.image_slot[1] = slot;
    expect_error(StatusCode::kInvalidArgument, "slot " + std::to_string(slot) + ", outside");
  }
  write_two_sequences();
  view_.image_pos[3] = -2;
  expect_error(StatusCode::kInvalidArgument, "image 3 starts at position -2");
  write_images({{}, {{0, 1}, {1, 3}}});  // positions 4 and 5 in both
  expect_error(StatusCode::kInvalidArgument, "position 4 lies in two of its images");

  write_two_sequences();
  view_.header->image_rows = kImageRows - 1;
  expect_error(StatusCode::kInvalidArgument, "images have 4 rows");

  write_two_sequences();
  view_.header->vision_pool[0] = '\0';
  expect_error(StatusCode::kInvalidArgument, "names no embedding pool");
  write_two_sequences();
  std::memset(view_.header->vision_pool, 'x', proto::kVisionPoolNameBytes);
  expect_error(StatusCode::kInvalidArgument, "not NUL-terminated");
  write_two_sequences();
  view_.header->vision_incarnation = 0;
  expect_error(StatusCode::kInvalidArgument, "no vision incarnation");
  write_two_sequences();
  std::snprintf(view_.header->vision_pool, proto::kVisionPoolNameBytes, "%s-missing",
                pool_name_.c_str());
  expect_error(StatusCode::kNotFound, "cannot open the step's embedding pool");
  write_two_sequences();
  view_.header->vision_incarnation = kVisionIncarnation + 1;
  expect_error(StatusCode::kUnavailable, "cannot open the step's embedding pool");

  // The pool's rows against the model's hidden size, and a reader that takes no images.
  reader_ = RingStepReader(kHidden + 2);
  write_two_sequences();
  expect_error(StatusCode::kInvalidArgument, "has rows of 6 floats, the model's hidden size is 8");
  EXPECT_EQ(reader_.pool(), nullptr);
  reader_ = RingStepReader();
  write_two_sequences();
  expect_error(StatusCode::kUnsupported, "takes none");

  // A ring without room for images refuses any.
  proto::StepRingLimits no_images = limits_;
  no_images.max_images = 0;
  reader_ = RingStepReader(kHidden);
  write_two_sequences();
  StepBatchView b;
  EXPECT_FALSE(reader_.read(view_, no_images, previous_, false, &b).is_ok());
  // After all of that, a good step reads.
  write_two_sequences();
  EXPECT_TRUE(read(&b).is_ok());
}

// row_index: every slot starts a whole number of rows after slot 0, 64-byte aligned, whatever
// the hidden size (odd sizes need padding rows).
TEST(EmbeddingPoolRowIndex, ReachesEverySlotFromTheFirstRow) {
  for (const EmbeddingPoolGeometry& g :
       {EmbeddingPoolGeometry{5, 7, 19}, EmbeddingPoolGeometry{3, 5, 6},
        EmbeddingPoolGeometry{4, 3, 16}, EmbeddingPoolGeometry{2, 1, 1},
        EmbeddingPoolGeometry{3, 576, 4096}}) {
    SCOPED_TRACE(std::to_string(g.hidden));
    const std::string name = "litellama-test-row-index-" + std::to_string(getpid());
    auto pool = EmbeddingPool::create(name, g, 1);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    const EmbeddingPool& p = **pool;
    const float* base = p.rows(0).data();
    int64_t previous_end = 0;
    for (int32_t slot = 0; slot < g.n_slots; ++slot) {
      EXPECT_EQ(base + p.row_index(slot, 0) * g.hidden, p.rows(slot).data());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.rows(slot).data()) % 64, 0u);
      EXPECT_GE(p.row_index(slot, 0), previous_end);  // slots do not overlap
      for (int32_t row = 0; row < g.rows_per_slot; ++row) {
        ASSERT_EQ(p.row_index(slot, row), p.row_index(slot, 0) + row);
      }
      previous_end = p.row_index(slot, g.rows_per_slot - 1) + 1;
      // The last row ends inside the region.
      EXPECT_LE(reinterpret_cast<const char*>(base + previous_end * g.hidden),
                reinterpret_cast<const char*>(base) + p.size_bytes());
    }
    if (g.hidden % 16 == 0) {
      EXPECT_EQ(p.row_index(1, 0), g.rows_per_slot);  // no padding
    }
    EXPECT_EQ(p.row_index(-1, 0), -1);
    EXPECT_EQ(p.row_index(g.n_slots, 0), -1);
    EXPECT_EQ(p.row_index(0, -1), -1);
    EXPECT_EQ(p.row_index(0, g.rows_per_slot), -1);
  }
}

}  // namespace
}  // namespace litellama
