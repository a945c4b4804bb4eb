// Scheduler pieces without processes: KV slot allocator, wire codec, the continuous batcher's
// placeholders and slot release, the stateless detokenization window, image token runs.
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "common/image_token_runs.h"
#include "common/proto/client_messages.h"
#include "common/proto/step_ring.h"
#include "common/proto/worker_messages.h"
#include "services/scheduler/continuous_batcher.h"
#include "services/scheduler/kv_slot_allocator.h"
#include "services/tokenizer/service/detokenize_window.h"
#include "tests/support/raw_message.h"

namespace litellama {
namespace {

TEST(KvSlotAllocator, AllocateReleaseRefcountReserve) {
  KvSlotAllocator a(7);
  std::vector<int32_t> s;
  ASSERT_TRUE(a.allocate(5, &s).is_ok());
  EXPECT_EQ(a.n_used(), 5);
  EXPECT_FALSE(a.allocate(3, &s).is_ok());
  EXPECT_EQ(s.size(), 5u);  // nothing half-allocated
  a.retain(std::span<const int32_t>(s.data(), 2));
  a.release(s);
  EXPECT_EQ(a.n_used(), 2);  // shared ones still held
  a.release(std::span<const int32_t>(s.data(), 2));
  a.release(std::span<const int32_t>(s.data(), 2));  // double release is ignored
  EXPECT_EQ(a.n_free(), 7);
  ASSERT_TRUE(a.reserve(6).is_ok());
  EXPECT_FALSE(a.reserve(2).is_ok());
  a.unreserve(6);
  EXPECT_EQ(a.n_free_unreserved(), 7);
}

// Each image is one image token (expanded) or a run of exactly its count, at odd sizes: the
// expansion, the images' first positions, and the refusals with their numbers.
TEST(ImageTokenRuns, ExpandsSingleTokensKeepsFullRunsRefusesTheRest) {
  constexpr int32_t kImage = 9;
  auto runs = expand_image_token_runs(std::vector<int32_t>{1, 9, 2, 9, 9, 9, 3, 9}, kImage, 3, 3);
  ASSERT_TRUE(runs.is_ok()) << runs.status().to_string();
  EXPECT_EQ(runs->prompt_ids, (std::vector<int32_t>{1, 9, 9, 9, 2, 9, 9, 9, 3, 9, 9, 9}));
  EXPECT_EQ(runs->image_positions, (std::vector<int32_t>{1, 5, 9}));
  auto none = expand_image_token_runs(std::vector<int32_t>{4, 5}, kImage, 7, 0);
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(none->image_positions.empty());
  // Adjacent images are one run, of a length no image has: refused as the scheduler always has.
  EXPECT_FALSE(expand_image_token_runs(std::vector<int32_t>{9, 9}, kImage, 3, 2).is_ok());

  auto run_of_two = expand_image_token_runs(std::vector<int32_t>{1, 9, 9}, kImage, 3, 1);
  ASSERT_FALSE(run_of_two.is_ok());
  EXPECT_NE(run_of_two.status().message().find("a run of 2 image tokens (id 9)"), std::string::npos)
      << run_of_two.status().message();
  auto too_few = expand_image_token_runs(std::vector<int32_t>{1, 9}, kImage, 3, 2);
  ASSERT_FALSE(too_few.is_ok());
  EXPECT_NE(too_few.status().message().find("has 1 images (image token id 9) but the request "
                                            "carries 2"),
            std::string::npos)
      << too_few.status().message();
  // Many single tokens against one image: refused by count, before any expansion.
  auto many = expand_image_token_runs(std::vector<int32_t>(19, 9), kImage, 1 << 20, 1);
  ASSERT_FALSE(many.is_ok());
  EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(expand_image_token_runs(std::vector<int32_t>{1}, kImage, 0, 0).is_ok());
}

TEST(ProtoCodec, RoundTripAndRejections) {
  proto::GenerateRequest r;
  r.request_id = 19;
  r.prompt_ids = {1, 3, 7};
  r.messages = {{"user", "héllo"}};
  r.stop = {"\n\n"};
  r.sampling.top_p = 0.5f;
  auto back = proto::decode<proto::GenerateRequest>(proto::encode(r));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->request_id, 19u);
  EXPECT_EQ(back->prompt_ids, r.prompt_ids);
  EXPECT_EQ(back->messages[0].content, "héllo");
  EXPECT_EQ(back->sampling.top_p, 0.5f);
  // Wrong type for the struct asked for, truncated bytes, garbage.
  EXPECT_FALSE(proto::decode<proto::AbortRequest>(proto::encode(r)).is_ok());
  const std::string bytes = proto::encode(r);
  EXPECT_FALSE(proto::Envelope::parse(bytes.substr(0, bytes.size() - 3)).is_ok());
  EXPECT_FALSE(proto::Envelope::parse("\xc1").is_ok());
  EXPECT_FALSE(proto::Envelope::parse("").is_ok());
  for (int t = 0; t <= static_cast<int>(proto::MessageType::kEncodeImageReply); ++t) {
    const auto type = static_cast<proto::MessageType>(t);
    EXPECT_EQ(proto::parse_message_type(proto::message_type_name(type)), type);
  }
}

// SamplingParams on the wire: a map of its eight named fields (not its padding), every field
// round-trips, absent keys keep their defaults, unknown keys are ignored and a wrong type names
// the message's field.
TEST(ProtoCodec, SamplingParamsIsAMapOfItsNamedFields) {
  proto::GenerateRequest r;
  r.sampling.temperature = 0.7f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.9f;
  r.sampling.min_p = 0.05f;
  r.sampling.repetition_penalty = 1.1f;
  r.sampling.frequency_penalty = 0.2f;
  r.sampling.presence_penalty = -0.3f;
  r.sampling.seed = (uint64_t{1} << 60) + 7;
  r.logprobs = true;
  r.top_logprobs = 4;
  auto back = proto::decode<proto::GenerateRequest>(proto::encode(r));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(std::memcmp(&back->sampling, &r.sampling, sizeof(SamplingParams)), 0);
  EXPECT_TRUE(back->logprobs);
  EXPECT_EQ(back->top_logprobs, 4);

  auto pack_request = [](auto&& write_sampling, uint32_t n_sampling_keys) {
    return testing::pack_raw_message(3, proto::kProtocolVersion, "generate_request",
                                     [&](testing::RawPacker& p) {
                                       p.pack(std::string("sampling"));
                                       p.pack_map(n_sampling_keys);
                                       write_sampling(p);
                                     });
  };
  const std::string partial = pack_request(
      [](auto& p) {
        p.pack(std::string("top_k"));
        p.pack(5);
        p.pack(std::string("not_a_field"));
        p.pack(std::string("ignored"));
      },
      2);
  auto got = proto::decode<proto::GenerateRequest>(partial);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->sampling.top_k, 5);
  EXPECT_EQ(got->sampling.top_p, 1.0f);
  EXPECT_EQ(got->sampling.repetition_penalty, 1.0f);
  const std::string wrong = pack_request(
      [](auto& p) {
        p.pack(std::string("temperature"));
        p.pack(std::string("hot"));
      },
      1);
  auto refused = proto::decode<proto::GenerateRequest>(wrong);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("field 'sampling' has the wrong type"),
            std::string::npos)
      << refused.status().message();
}

// A fake model: the next id is a function of the fed id and its position.
int32_t fake_next(int32_t id, int32_t pos) {
  return (id * 31 + pos * 7 + 1) % 1000;
}

TEST(ContinuousBatcher, TopLogitsAreAskedOnlyForTheFirstTokenAndKeptWithIt) {
  KvSlotAllocator allocator(100);
  BatcherOptions options;
  options.max_prefill_chunk = 5;  // the 7-id prompt takes two steps
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(1000, 0, {});
  auto ring = proto::StepRing::create("litellama-unit-ring-top", {64, 8, 100, 0, 4 * 100 + 16 * 8});
  ASSERT_TRUE(ring.is_ok());
  Request wants, plain;
  wants.id = 1;
  wants.prompt_ids = {1, 2, 3, 4, 5, 6, 7};
  wants.max_tokens = 3;
  wants.n_top_logits = 3;
  plain.id = 2;
  plain.prompt_ids = {9};
  plain.max_tokens = 3;
  batcher.enqueue(&wants);
  batcher.enqueue(&plain);
  std::vector<Request*> rejected, updated;
  std::vector<int32_t> header_top;
  for (uint64_t step_id = 1; step_id < 10 && batcher.has_work(); ++step_id) {
    auto plan = batcher.plan(step_id, (*ring)->buffer(0), (*ring)->limits(), &rejected);
    ASSERT_TRUE(plan.has_value());
    proto::StepView v = (*ring)->buffer(0);
    header_top.push_back(v.header->n_top_logits);
    EXPECT_EQ(plan->n_top_logits, v.header->n_top_logits);
    const size_t n = plan->request_ids.size();
    for (size_t s = 0; s < n; ++s) {
      v.sampled_ids[s] = plan->sampled[s] ? 100 + static_cast<int32_t>(step_id) : -1;
      for (int k = 0; k < v.header->n_top_logits; ++k) {
        const size_t at = s * proto::kMaxStepTopLogits + static_cast<size_t>(k);
        v.top_ids[at] = static_cast<int32_t>(10 * plan->request_ids[s]) + k;
        v.top_values[at] = 5.0f - static_cast<float>(k);
      }
    }
    StepTopLogits top{v.top_ids.first(n * proto::kMaxStepTopLogits),
                      v.top_values.first(n * proto::kMaxStepTopLogits)};
    batcher.complete(*plan, v.sampled_ids.first(n), &updated, top);
  }
  // Step 1 samples plain's first token only; step 2 wants' first token; later steps decode.
  ASSERT_GE(header_top.size(), 3u);
  EXPECT_EQ(header_top[0], 0);
  EXPECT_EQ(header_top[1], 3);
  for (size_t i = 2; i < header_top.size(); ++i) EXPECT_EQ(header_top[i], 0) << "step " << i + 1;
  const std::vector<std::pair<int32_t, float>> expected = {{10, 5.0f}, {11, 4.0f}, {12, 3.0f}};
  EXPECT_EQ(wants.top_logits, expected);
  EXPECT_TRUE(plain.top_logits.empty());
  EXPECT_EQ(wants.output_ids.size(), 3u);
  EXPECT_EQ(plain.output_ids.size(), 3u);
}

TEST(ContinuousBatcher, OverlappedStepsMatchSequentialGeneration) {
  KvSlotAllocator allocator(200);
  BatcherOptions options;
  options.max_batch_tokens = 9;  // forces chunked prefill
  options.max_prefill_chunk = 5;
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(1000, 0, {});
  auto ring = proto::StepRing::create("litellama-unit-ring", {64, 8, 200, 200, 4 * 200 + 16 * 8});
  ASSERT_TRUE(ring.is_ok());
  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 4; ++i) {
    auto r = std::make_unique<Request>();
    r->id = static_cast<uint64_t>(i + 1);
    for (int k = 0; k < 3 + 4 * i; ++k) r->prompt_ids.push_back(10 * i + k);
    r->max_tokens = 5 + i;
    batcher.enqueue(r.get());
    requests.push_back(std::move(r));
  }
  // Worker side: resolve placeholders from the previous step, then "sample".
  std::vector<int32_t> previous;
  std::vector<std::pair<PlannedStep, int>> in_flight;
  uint64_t step_id = 1;
  int buffer = 0;
  std::vector<Request*> rejected, updated;
  auto run_worker = [&](const PlannedStep& plan, int buf) {
    proto::StepView v = (*ring)->buffer(buf);
    std::vector<int32_t> sampled(static_cast<size_t>(v.header->n_seqs), -1);
    for (int s = 0; s < v.header->n_seqs; ++s) {
      const int32_t last = v.token_start[static_cast<size_t>(s + 1)] - 1;
      int32_t id = v.token_ids[static_cast<size_t>(last)];
      if (id < 0) id = previous.at(static_cast<size_t>(-id - 1));
      if (v.sample[static_cast<size_t>(s)]) {
        sampled[static_cast<size_t>(s)] = fake_next(id, v.positions[static_cast<size_t>(last)]);
      }
      std::copy(sampled.begin(), sampled.end(), v.sampled_ids.begin());
    }
    previous = sampled;
    (void)plan;
  };
  for (int iter = 0; iter < 200 && batcher.has_work(); ++iter) {
    while (in_flight.size() < 2) {
      auto plan = batcher.plan(step_id, (*ring)->buffer(buffer), (*ring)->limits(), &rejected);
      if (!plan) break;
      in_flight.push_back({*plan, buffer});
      ++step_id;
      buffer ^= 1;
    }
    ASSERT_FALSE(in_flight.empty());
    auto [plan, buf] = in_flight.front();
    in_flight.erase(in_flight.begin());
    run_worker(plan, buf);
    updated.clear();
    batcher.complete(plan, (*ring)->buffer(buf).sampled_ids.first(plan.request_ids.size()),
                     &updated);
  }
  while (!in_flight.empty()) {  // steps still out when the last request finished
    auto [plan, buf] = in_flight.front();
    in_flight.erase(in_flight.begin());
    run_worker(plan, buf);
    batcher.complete(plan, (*ring)->buffer(buf).sampled_ids.first(plan.request_ids.size()),
                     &updated);
  }
  EXPECT_TRUE(rejected.empty());
  for (const auto& r : requests) {
    std::vector<int32_t> expected;
    int32_t id = r->prompt_ids.back();
    int32_t pos = r->n_prompt() - 1;
    for (int k = 0; k < r->max_tokens; ++k) {
      id = fake_next(id, pos++);
      expected.push_back(id);
    }
    EXPECT_EQ(r->output_ids, expected) << "request " << r->id;
    EXPECT_EQ(r->finish, RequestFinish::kLength);
  }
  // What is still held is the prefix cache's, and nobody else's.
  EXPECT_EQ(allocator.n_used(), batcher.cache().n_cached_slots());
  EXPECT_EQ(batcher.cache().n_evictable(), allocator.n_used());
  EXPECT_EQ(allocator.n_reserved(), 0);
}

TEST(DetokenizeWindow, HoldsSplitCharactersAndFlushes) {
  // "ids" are bytes here; decode maps invalid UTF-8 tails to U+FFFD like a tokenizer does.
  const DecodeFn decode = [](std::span<const int32_t> ids) -> Result<std::string> {
    std::string s;
    for (int32_t id : ids) s.push_back(static_cast<char>(id));
    if (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) {
      const unsigned char c = static_cast<unsigned char>(s.back());
      if (c >= 0xC0) s.replace(s.size() - 1, 1, "\xEF\xBF\xBD");
    }
    return s;
  };
  proto::DetokenizeItem item;
  item.token_ids = {'a', ' ', 'b', 0xC3};  // "a b" + first byte of "é"
  item.read_offset = 2;
  auto r = detokenize_window(item, decode);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->advanced);
  item.token_ids.push_back(0xA9);
  r = detokenize_window(item, decode);
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->advanced);
  EXPECT_EQ(r->text, "b\xC3\xA9");
  item.read_offset = 99;
  EXPECT_FALSE(detokenize_window(item, decode).is_ok());
}

}  // namespace
}  // namespace litellama
