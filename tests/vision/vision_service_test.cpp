// litellama-vision as a process: a fake scheduler (a ROUTER on an ipc endpoint) receives its
// heartbeat, opens the embedding pool it names, and sends images as two-frame encode requests.
// The rows the service writes into the pool are the in-process encoder's for the same image, bit
// for bit (same code, same thread count); bad input gets an error reply and never takes the
// service down; the pool goes away with the service.
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/net/child_process.h"
#include "common/net/zmq_util.h"
#include "common/proto/vision_messages.h"
#include "services/vision/embedding_pool.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "tests/vision/vision_test_util.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

using namespace std::chrono_literals;

class FakeScheduler {
 public:
  explicit FakeScheduler(const std::string& endpoint) : router_(ctx_, zmq::socket_type::router) {
    net::configure_router(router_);
    router_.bind(endpoint);
  }

  // The next message within `timeout` (identity stripped), or no frames.
  std::vector<zmq::message_t> next(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<zmq::message_t> frames;
    while (std::chrono::steady_clock::now() < deadline) {
      net::wait_readable({&router_}, 50);
      if (net::recv_frames(router_, &frames) && frames.size() >= 2) {
        identity_ = std::string(net::frame_view(frames[0]));
        frames.erase(frames.begin());
        return frames;
      }
    }
    return {};
  }

  Result<proto::VisionHeartbeat> heartbeat() {
    for (int i = 0; i < 200; ++i) {
      auto frames = next(100ms);
      if (frames.empty()) continue;
      auto hb = proto::decode<proto::VisionHeartbeat>(net::frame_view(frames[0]));
      if (hb) return hb;
    }
    return make_error(StatusCode::kUnavailable, "no vision heartbeat");
  }

  // Sends an encode request (with `bytes` as its second frame unless nullopt) and waits for the
  // reply to it, skipping heartbeats.
  Result<proto::EncodeImageReply> encode(uint64_t op_id, int32_t slot,
                                         std::optional<std::string> bytes) {
    proto::EncodeImageRequest r;
    r.op_id = op_id;
    r.image_hash = op_id * 7;
    r.slot = slot;
    const std::string head = proto::encode(r);
    router_.send(zmq::buffer(identity_), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(head), bytes ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (bytes) router_.send(zmq::buffer(*bytes), zmq::send_flags::none);
    for (int i = 0; i < 300; ++i) {
      auto frames = next(100ms);
      if (frames.empty()) continue;
      auto reply = proto::decode<proto::EncodeImageReply>(net::frame_view(frames[0]));
      if (reply && reply->op_id == op_id) return reply;
    }
    return make_error(StatusCode::kUnavailable, "no reply to encode {}", op_id);
  }

  void send_raw(const std::string& payload) {
    router_.send(zmq::buffer(identity_), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(payload), zmq::send_flags::none);
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t router_;
  std::string identity_;
};

std::string image_bytes(const std::string& name) {
  const std::vector<uint8_t> v = vision::test::read_bytes(vision::test::images_dir() / name);
  return std::string(v.begin(), v.end());
}

TEST(VisionService, EncodesIntoThePoolAndAnswersBadInputWithErrors) {
  test::TempDir tmp;
  const std::string model = tmp.sub("llava");
  test::make_model(model, "llava-tiny", 99, 1);
  const std::string endpoint = "ipc://" + tmp.sub("vision.sock");
  FakeScheduler scheduler(endpoint);
  auto child = net::ChildProcess::spawn(
      {test::bin_dir() + "/litellama-vision", "--model", model, "--scheduler", endpoint,
       "--metrics", "", "--threads", "2", "--max-image-bytes", "100000", "--vision-pool-bytes",
       "40000", "--run-dir", tmp.sub("run")},
      tmp.sub("vision.log"));
  ASSERT_TRUE(child.is_ok()) << child.status().to_string();
  auto hb = scheduler.heartbeat();
  ASSERT_TRUE(hb.is_ok()) << hb.status().to_string();
  // llava-tiny: 25 image tokens of hidden 64 per image, 6400 bytes a slot: 6 fit in 40000.
  EXPECT_EQ(hb->device, "cpu");
  EXPECT_EQ(hb->rows_per_slot, 25);
  EXPECT_EQ(hb->hidden, 64);
  EXPECT_EQ(hb->n_slots, 6);
  EXPECT_EQ(hb->max_image_bytes, 100000);
  auto pool = EmbeddingPool::open(hb->pool_name, hb->incarnation);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();

  // The in-process encoder's rows for the same image.
  auto ckpt = Checkpoint::open(model);
  ASSERT_TRUE(ckpt.is_ok());
  auto encoder = vision::LlavaVisionEncoder::load(*ckpt, 2);
  ASSERT_TRUE(encoder.is_ok());
  auto config = vision::load_clip_preprocess_config(model);
  ASSERT_TRUE(config.is_ok());
  for (const auto& [slot, name] : {std::pair{3, "rgb_37x23.png"}, std::pair{5, "gray_29x40.jpg"}}) {
    SCOPED_TRACE(name);
    const std::string bytes = image_bytes(name);
    auto reply = scheduler.encode(10 + slot, slot, bytes);
    ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
    EXPECT_EQ(reply->error, "");
    EXPECT_EQ(reply->slot, slot);
    EXPECT_EQ(reply->image_hash, static_cast<uint64_t>(10 + slot) * 7);
    EXPECT_EQ(reply->n_rows, 25);
    EXPECT_GT(reply->finished_unix_ns, 0);
    auto rgb = vision::decode_image(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(rgb.is_ok());
    auto pixels = vision::clip_preprocess(*rgb, *config);
    ASSERT_TRUE(pixels.is_ok());
    auto expected = (*encoder)->encode(*pixels);
    ASSERT_TRUE(expected.is_ok());
    const std::span<const float> rows = std::as_const(**pool).rows(slot);
    ASSERT_EQ(rows.size(), expected->size());
    EXPECT_EQ(std::memcmp(rows.data(), expected->data(), rows.size() * sizeof(float)), 0);
  }

  // Bad input: each gets an error reply naming the problem, and the service serves on.
  auto garbage = scheduler.encode(20, 0, std::string("not an image at all"));
  ASSERT_TRUE(garbage.is_ok());
  EXPECT_TRUE(garbage->bad_image);
  EXPECT_NE(garbage->error, "");
  const std::string png = image_bytes("rgb_37x23.png");
  auto truncated = scheduler.encode(21, 0, png.substr(0, png.size() / 2));
  ASSERT_TRUE(truncated.is_ok());
  EXPECT_TRUE(truncated->bad_image);
  auto no_bytes = scheduler.encode(22, 0, std::nullopt);
  ASSERT_TRUE(no_bytes.is_ok());
  EXPECT_TRUE(no_bytes->bad_image);
  auto too_big = scheduler.encode(23, 0, std::string(100001, 'x'));
  ASSERT_TRUE(too_big.is_ok());
  EXPECT_TRUE(too_big->bad_image);
  EXPECT_NE(too_big->error.find("100000"), std::string::npos) << too_big->error;
  auto bad_slot = scheduler.encode(24, 6, png);
  ASSERT_TRUE(bad_slot.is_ok());
  EXPECT_FALSE(bad_slot->bad_image);
  EXPECT_NE(bad_slot->error.find("slot 6"), std::string::npos) << bad_slot->error;
  scheduler.send_raw("\xc1 garbage");
  scheduler.send_raw(proto::encode(proto::VisionHeartbeat{}));  // a type it never receives
  auto after = scheduler.encode(25, 1, png);
  ASSERT_TRUE(after.is_ok()) << "the service stopped answering after bad input";
  EXPECT_EQ(after->error, "");

  // A clean stop removes the pool.
  EXPECT_EQ(child->stop(), 0);
  pool->reset();
  EXPECT_FALSE(EmbeddingPool::open(hb->pool_name).is_ok());
}

TEST(VisionService, RefusesAModelWithoutAVisionTowerAndCudaInABuildWithoutIt) {
  test::TempDir tmp;
  const std::string text_model = tmp.sub("text");
  test::make_model(text_model, "llama3-tiny", 1, 1);
  const std::string llava = tmp.sub("llava");
  test::make_model(llava, "llava-tiny", 1, 1);
  const std::string endpoint = "ipc://" + tmp.sub("vision.sock");
  std::vector<std::tuple<std::string, const char*, const char*>> cases = {
      {text_model, "cpu", "not a LLaVA checkpoint"}};
#if !LITELLAMA_VISION_CUDA
  // CUDA builds run --device cuda (tests/gpu/cuda_vision_test.cpp).
  cases.emplace_back(llava, "cuda", "has no CUDA backend");
#endif
  for (const auto& [model, device, words] : cases) {
    auto child = net::ChildProcess::spawn(
        {test::bin_dir() + "/litellama-vision", "--model", model, "--device", device, "--scheduler",
         endpoint, "--metrics", "", "--run-dir", tmp.sub("run")},
        tmp.sub("refused.log"));
    ASSERT_TRUE(child.is_ok());
    std::optional<int> status;
    for (int i = 0; i < 300 && !status; ++i) {
      std::this_thread::sleep_for(20ms);
      status = child->poll();
    }
    ASSERT_TRUE(status.has_value()) << "the service did not exit";
    EXPECT_EQ(*status, net::kExitConfigError);
  }
  std::ifstream log(tmp.sub("refused.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  for (const auto& [model, device, words] : cases) {
    EXPECT_NE(text.find(words), std::string::npos) << words << "\n" << text;
  }
}

}  // namespace
}  // namespace litellama
