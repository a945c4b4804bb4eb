// Images through the services (CPU): scheduler, worker, tokenizer and litellama-vision on the
// llava-tiny checkpoint. A request with an image gets the greedy ids and top logits of the
// in-process engine given the in-process encoder's rows, bit for bit (float32); the same image
// again is not encoded again and its prompt's KV comes from the prefix cache; another image
// changes the output; bad images and mismatched image counts get clear errors; the vision
// process dying fails the requests that need it, with a clear error, and the server serves on.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/net/run_dir.h"
#include "common/proto/tokenizer_messages.h"
#include "services/tokenizer/tokenizer.h"
#include "services/vision/clip_preprocess.h"
#include "services/vision/image_decode.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/offline_engine.h"
#include "tests/integration/service_cluster.h"
#include "tests/vision/llava_engine_answer.h"

namespace litellama {
namespace {

using testing::ServiceCluster;

std::string read_image(const std::string& name) {
  const std::string path =
      testing::env_or("LITELLAMA_SOURCE_DIR", ".") + "/tests/golden/images/" + name;
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

using Expected = vision::test::EngineAnswer;

Expected expected_for(const std::string& model, const std::vector<int32_t>& text_before,
                      const std::string& image, const std::vector<int32_t>& text_after,
                      int32_t n_new) {
  return vision::test::llava_engine_answer(model, text_before, image, text_after, n_new);
}

std::string base64(const std::string& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(k[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(k[(acc << (6 - bits)) & 63]);
  while (out.size() % 4 != 0) out.push_back('=');
  return out;
}

// A LLaVA-1.5-style chat template ("USER: <image>\n... ASSISTANT:") in the model's
// tokenizer_config.json: the assets' Llama 2 tokenizer has none.
void add_chat_template(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  std::ifstream in(path);
  nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  in.close();
  ASSERT_TRUE(config.is_object());
  config["chat_template"] =
      "{% for m in messages %}{{ m['role'].upper() + ': ' + m['content'] + '\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";
  std::ofstream(path) << config.dump(2);
}

// llava-hf's LLaVA-1.5 checkpoints keep their chat template in the processor's
// chat_template.json, in this form: each message's content read as typed parts, images first.
void add_processor_chat_template(const std::string& model_dir) {
  const nlohmann::json processor = {
      {"chat_template",
       "{% for message in messages %}{% if message['role'] != 'system' %}{{ "
       "message['role'].upper() + ': '}}{% endif %}{% for content in message['content'] | "
       "selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{% for content in "
       "message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% "
       "endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"}};
  std::ofstream(model_dir + "/chat_template.json") << processor.dump();
}

TEST(VisionIntegration, AProcessorTemplateThatReadsTypedPartsGetsThemThroughHttp) {
  ServiceCluster cluster;
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  ASSERT_NO_FATAL_FAILURE(add_processor_chat_template(cluster.model_dir()));
  const int api_port = testing::free_tcp_port();
  cluster.add_scheduler_args(
      {"--api-listen", "127.0.0.1:" + std::to_string(api_port), "--served-model-name", "llava"});
  ASSERT_NO_FATAL_FAILURE(cluster.start_with_vision());
  auto client = cluster.client();
  ASSERT_TRUE(testing::poll_until(
      [&] { return testing::http(api_port, "GET", "/ready").status == 200; }, 10000));
  // The prompt the template renders, as the tokenizer encodes it; the image token becomes 25.
  auto tok = Tokenizer::load(cluster.model_dir());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto tokens_of = [&](const std::string& prompt) {
    const std::vector<int32_t> ids = tok->encode(prompt, false);
    return static_cast<int>(ids.size()) +
           24 * static_cast<int>(std::count(ids.begin(), ids.end(), 32000));
  };
  auto chat = [&](const nlohmann::json& content) {
    const nlohmann::json body = {{"model", "llava"},
                                 {"max_tokens", 2},
                                 {"messages", {{{"role", "user"}, {"content", content}}}}};
    return testing::http(api_port, "POST", "/v1/chat/completions", body.dump(),
                         {"Content-Type: application/json"});
  };
  const std::string png = read_image("rgb_37x23.png");
  // Text, then the image: the template places the image first.
  const auto with_image = chat(
      {{{"type", "text"}, {"text", "What is in the image?"}},
       {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + base64(png)}}}}});
  ASSERT_EQ(with_image.status, 200) << with_image.body;
  EXPECT_EQ(nlohmann::json::parse(with_image.body)["usage"]["prompt_tokens"].get<int>(),
            tokens_of("USER: <image>\nWhat is in the image? ASSISTANT:"))
      << with_image.body;
  // A plain string is one text part; the template would have rendered a string as nothing.
  const auto plain = chat("Hello there");
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(nlohmann::json::parse(plain.body)["usage"]["prompt_tokens"].get<int>(),
            tokens_of("USER: Hello there ASSISTANT:"))
      << plain.body;
}

TEST(VisionIntegration, ImagesThroughTheServicesMatchTheInProcessEngine) {
  ServiceCluster cluster;
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  ASSERT_NO_FATAL_FAILURE(add_chat_template(cluster.model_dir()));
  const int api_port = testing::free_tcp_port();
  const std::filesystem::path media = cluster.dir() / "media";
  std::filesystem::create_directories(media);
  std::ofstream(media / "cat.png", std::ios::binary) << read_image("rgb_37x23.png");
  cluster.add_scheduler_args({"--api-listen", "127.0.0.1:" + std::to_string(api_port),
                              "--served-model-name", "llava", "--allowed-local-media-path",
                              media.string()});
  ASSERT_NO_FATAL_FAILURE(cluster.start_with_vision());
  auto client = cluster.client();
  auto info = client->server_info(1000);
  ASSERT_TRUE(info.is_ok());
  EXPECT_EQ(info->image_token_id, 32000);
  EXPECT_EQ(info->image_tokens, 25);

  const std::vector<int32_t> before = {1, 319, 1967, 29901};
  const std::vector<int32_t> after = {13, 5618, 338, 445};
  const std::string png = read_image("rgb_37x23.png");
  const std::string jpg = read_image("gray_29x40.jpg");
  ASSERT_FALSE(png.empty());
  const Expected want = expected_for(cluster.model_dir(), before, png, after, 6);
  ASSERT_EQ(want.ids.size(), 6u);

  auto request = [&](int32_t n_image_tokens) {
    std::vector<int32_t> ids = before;
    ids.insert(ids.end(), static_cast<size_t>(n_image_tokens), 32000);
    ids.insert(ids.end(), after.begin(), after.end());
    proto::GenerateRequest r = testing::ignoring_eos_request(ids, 6);
    r.top_logits = 4;
    return r;
  };
  // One image token, expanded by the scheduler.
  auto first = client->generate(request(1), nullptr, 30000, {png});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string() << "\n" << cluster.logs();
  EXPECT_EQ(first->token_ids, want.ids);
  EXPECT_EQ(first->n_prompt_tokens, 4 + 25 + 4);
  ASSERT_EQ(first->top_logits.size(), want.top.size());
  for (size_t i = 0; i < want.top.size(); ++i) {
    EXPECT_EQ(first->top_logits[i].first, want.top[i].first);
    EXPECT_EQ(first->top_logits[i].second, want.top[i].second);  // float32: bit for bit
  }
  EXPECT_EQ(cluster.vision_encodes(), 1);
  // The worker measured the hand-off of the freshly encoded rows to the prefill, once.
  auto handoffs = [&] {
    return testing::metric_value(cluster.worker_metrics(),
                                 "litellama_worker_image_handoff_seconds_count");
  };
  EXPECT_EQ(handoffs(), 1);
  const double handoff =
      testing::metric_value(cluster.worker_metrics(), "litellama_worker_image_handoff_seconds_sum");
  EXPECT_GT(handoff, 0.0);
  EXPECT_LT(handoff, 10.0);

  // The same image, the prompt already expanded: not encoded again, and its KV is cached.
  auto second = client->generate(request(25), nullptr, 30000, {png});
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_EQ(second->token_ids, want.ids);
  EXPECT_GE(second->n_cached_tokens, 4 + 25);
  EXPECT_EQ(cluster.vision_encodes(), 1);

  // Another image: encoded, and the cache does not hand it the first image's KV.
  const Expected want_jpg = expected_for(cluster.model_dir(), before, jpg, after, 6);
  auto third = client->generate(request(1), nullptr, 30000, {jpg});
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  EXPECT_EQ(third->token_ids, want_jpg.ids);
  EXPECT_LE(third->n_cached_tokens, 4);
  EXPECT_EQ(cluster.vision_encodes(), 2);
  EXPECT_EQ(handoffs(), 2);  // the reused image had none to report

  // Bad input: each a clear error, and the server serves on.
  auto garbage = client->generate(request(1), nullptr, 30000, {std::string("no image here")});
  ASSERT_FALSE(garbage.is_ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("could not be used"), std::string::npos)
      << garbage.status().message();
  auto missing = client->generate(request(2), nullptr, 30000, {png});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("run of 2 image tokens"), std::string::npos)
      << missing.status().message();
  auto extra = client->generate(request(1), nullptr, 30000, {png, png});
  ASSERT_FALSE(extra.is_ok());
  EXPECT_NE(extra.status().message().find("carries 2"), std::string::npos)
      << extra.status().message();
  // The scheduler's view: three images reused or encoded as above (the garbage one encoded too,
  // then failed), and the pool's slots.
  const std::string metrics = cluster.scheduler_metrics();
  EXPECT_EQ(testing::metric_value(metrics, "litellama_scheduler_images_total{outcome=\"reused\"}"),
            1)
      << metrics;
  EXPECT_EQ(testing::metric_value(metrics, "litellama_scheduler_images_total{outcome=\"encoded\"}"),
            3);
  EXPECT_EQ(testing::metric_value(metrics, "litellama_scheduler_vision_up"), 1);
  EXPECT_EQ(testing::metric_value(metrics, "litellama_scheduler_image_slots{state=\"cached\"}"), 2);
  // A text prompt: "<image>" is the tokenizer's added token, expanded by the scheduler.
  proto::GenerateRequest text_prompt;
  text_prompt.prompt = "<image>\nWhat is in the image?";
  text_prompt.max_tokens = 3;
  text_prompt.ignore_eos = true;
  auto from_text = client->generate(text_prompt, nullptr, 30000, {png});
  ASSERT_TRUE(from_text.is_ok()) << from_text.status().to_string();
  EXPECT_GE(from_text->n_prompt_tokens, 25 + 2);
  EXPECT_GE(from_text->n_cached_tokens, 0);
  text_prompt.prompt = "What is in the image?";  // no image token but an image
  auto no_token = client->generate(text_prompt, nullptr, 30000, {png});
  ASSERT_FALSE(no_token.is_ok());
  EXPECT_NE(no_token.status().message().find("has 0 images"), std::string::npos)
      << no_token.status().message();

  // HTTP: an image_url part with a data: URL, in place of the image in the message.
  auto chat = [&](const std::string& url) {
    nlohmann::json body = {{"model", "llava"},
                           {"max_tokens", 3},
                           {"messages",
                            {{{"role", "user"},
                              {"content",
                               {{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                {{"type", "text"}, {"text", "What is in the image?"}}}}}}}};
    return testing::http(api_port, "POST", "/v1/chat/completions", body.dump(),
                         {"Content-Type: application/json"});
  };
  // The API learns readiness from the scheduler a moment after it.
  ASSERT_TRUE(testing::poll_until(
      [&] { return testing::http(api_port, "GET", "/ready").status == 200; }, 10000));
  const auto ok = chat("data:image/png;base64," + base64(png));
  ASSERT_EQ(ok.status, 200) << ok.body;
  const auto answer = nlohmann::json::parse(ok.body);
  EXPECT_GE(answer["usage"]["prompt_tokens"].get<int>(), 25 + 2) << ok.body;
  // The same image as a local file under --allowed-local-media-path.
  const auto local = chat("file://" + (media / "cat.png").string());
  ASSERT_EQ(local.status, 200) << local.body;
  EXPECT_EQ(nlohmann::json::parse(local.body)["usage"]["prompt_tokens"],
            answer["usage"]["prompt_tokens"])
      << local.body;
  const auto outside = chat("file://" + (cluster.dir() / "model" / "config.json").string());
  EXPECT_EQ(outside.status, 400) << outside.body;
  const auto remote = chat("https://example.invalid/cat.png");
  EXPECT_EQ(remote.status, 400) << remote.body;
  EXPECT_NE(remote.body.find("fetches no URL"), std::string::npos) << remote.body;
  const auto broken = chat("data:image/png;base64,@@@@");
  EXPECT_EQ(broken.status, 400) << broken.body;
  const auto not_image = chat("data:image/png;base64," + base64("plain text, no image"));
  EXPECT_EQ(not_image.status, 400) << not_image.body;

  // More images than the pool has slots (64 KiB: 10 slots of 25 x 64 floats) can never run.
  std::vector<int32_t> many_ids = before;
  many_ids.insert(many_ids.end(), 11, 32000);
  auto too_many = client->generate(testing::ignoring_eos_request(many_ids, 2), nullptr, 30000,
                                   std::vector<std::string>(11, png));
  ASSERT_FALSE(too_many.is_ok());
  EXPECT_NE(too_many.status().message().find("the vision pool holds 10"), std::string::npos)
      << too_many.status().message();
  auto text_only = client->generate(testing::ignoring_eos_request(before, 3), nullptr, 30000);
  ASSERT_TRUE(text_only.is_ok()) << text_only.status().to_string();

  // The vision process dies: a request whose KV already covers its image runs to its end;
  // new requests with images fail with a clear error; text goes on.
  auto long_request = request(1);
  long_request.max_tokens = 1800;
  auto long_id = client->submit(long_request, {png});
  ASSERT_TRUE(long_id.is_ok());
  bool streaming = false;
  const auto first_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!streaming && std::chrono::steady_clock::now() < first_deadline) {
    auto e = client->next_event(100);
    ASSERT_TRUE(e.is_ok());
    if (*e && (*e)->request_id() == *long_id) {
      ASSERT_EQ((*e)->kind, net::ClientEvent::Kind::kChunk) << (*e)->error.message;
      streaming = (*e)->chunk.n_generated_tokens > 0;
      ASSERT_FALSE((*e)->chunk.finished) << "1800 tokens ended before the vision process died";
    }
  }
  ASSERT_TRUE(streaming) << cluster.logs();
  cluster.process("vision").signal(SIGKILL);
  int32_t n_long = 0;
  bool long_done = false;
  bool done_before_lost = false;
  auto vision_seen_down = [&] {
    auto m = cluster.scheduler_metrics();
    return testing::metric_value(m, "litellama_scheduler_vision_up") == 0;
  };
  bool down = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!long_done && std::chrono::steady_clock::now() < deadline) {
    if (!down && vision_seen_down()) {
      down = true;
      done_before_lost = long_done;
    }
    auto e = client->next_event(20);
    ASSERT_TRUE(e.is_ok());
    if (!*e || (*e)->request_id() != *long_id) continue;
    ASSERT_EQ((*e)->kind, net::ClientEvent::Kind::kChunk) << (*e)->error.message;
    n_long = (*e)->chunk.n_generated_tokens;
    long_done = (*e)->chunk.finished;
  }
  EXPECT_TRUE(down || vision_seen_down());
  EXPECT_FALSE(done_before_lost) << "the request ended before the scheduler saw the vision go";
  EXPECT_TRUE(long_done);
  EXPECT_EQ(n_long, 1800);
  ASSERT_TRUE(testing::poll_until(
      [&] {
        auto i = client->server_info(1000);
        return i.is_ok() && !i->vision_up;
      },
      10000));
  auto after_death = client->generate(request(1), nullptr, 30000, {png});
  ASSERT_FALSE(after_death.is_ok());
  EXPECT_EQ(after_death.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(after_death.status().message().find("no vision service"), std::string::npos)
      << after_death.status().message();
  auto text_after = client->generate(testing::ignoring_eos_request(before, 3), nullptr, 30000);
  ASSERT_TRUE(text_after.is_ok()) << text_after.status().to_string();
  EXPECT_EQ(text_after->token_ids, text_only->token_ids);
}

// An encode_request as a scheduler without image fields sends it.
struct EncodeRequestWithoutImages {
  static constexpr proto::MessageType kType = proto::MessageType::kEncodeRequest;
  uint64_t op_id = 0;
  std::string text;
  std::vector<proto::ChatMessage> messages;
  bool add_special_tokens = true;
  MSGPACK_DEFINE_MAP(op_id, text, messages, add_special_tokens);
};

// The tokenizer process alone, its scheduler a ROUTER of the test's: an encode request naming the
// image token and its count gets every occurrence expanded (text and chat messages); without the
// fields (an older scheduler) the prompt comes back as the tokenizer encodes it; a count out of
// range or an expansion past the limit is an error reply, and the tokenizer serves on.
TEST(VisionIntegration, TheTokenizerExpandsTheImageTokenItIsAskedTo) {
  ServiceCluster cluster;
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  ASSERT_NO_FATAL_FAILURE(add_chat_template(cluster.model_dir()));
  ASSERT_TRUE(net::prepare_run_dir(cluster.run_dir()).is_ok());
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  net::configure_router(router);
  router.bind(cluster.endpoint("tokenizer"));
  cluster.start_tokenizer();
  std::string identity;
  std::vector<zmq::message_t> frames;
  // The next message of type T from the tokenizer (heartbeats skipped), within 20 s.
  auto next = [&]<typename T>(T*) -> Result<T> {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      net::wait_readable({&router}, 50);
      while (net::recv_frames(router, &frames)) {
        if (frames.size() != 2) continue;
        identity = std::string(net::frame_view(frames[0]));
        auto message = proto::decode<T>(net::frame_view(frames[1]));
        if (message) return message;
      }
    }
    return make_error(StatusCode::kUnavailable, "no message from the tokenizer");
  };
  ASSERT_TRUE(next(static_cast<proto::TokenizerHeartbeat*>(nullptr)).is_ok())
      << cluster.log("tokenizer");
  uint64_t op = 0;
  auto encode = [&](const auto& request) -> Result<proto::EncodeReply> {
    router.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    router.send(zmq::buffer(proto::encode(request)), zmq::send_flags::none);
    while (true) {
      auto reply = next(static_cast<proto::EncodeReply*>(nullptr));
      if (!reply || reply->op_id == request.op_id) return reply;
    }
  };
  auto runs_of = [](const std::vector<int32_t>& ids, int32_t token) {
    std::vector<size_t> runs;
    for (size_t i = 0; i < ids.size();) {
      if (ids[i] != token) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < ids.size() && ids[end] == token) ++end;
      runs.push_back(end - i);
      i = end;
    }
    return runs;
  };
  auto without_images = [](const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t id : ids) {
      if (id != 32000) out.push_back(id);
    }
    return out;
  };

  proto::EncodeRequest text;
  text.op_id = ++op;
  text.text = "<image>\nWhat is in the image?";
  auto plain = encode(text);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  ASSERT_EQ(plain->error, "");
  EXPECT_EQ(runs_of(plain->token_ids, 32000), std::vector<size_t>{1});
  EncodeRequestWithoutImages old;
  old.op_id = ++op;
  old.text = text.text;
  auto from_old = encode(old);
  ASSERT_TRUE(from_old.is_ok()) << from_old.status().to_string();
  EXPECT_EQ(from_old->token_ids, plain->token_ids);

  text.op_id = ++op;
  text.image_token_id = 32000;
  text.image_token_count = 25;
  auto expanded = encode(text);
  ASSERT_TRUE(expanded.is_ok()) << expanded.status().to_string();
  ASSERT_EQ(expanded->error, "");
  EXPECT_EQ(runs_of(expanded->token_ids, 32000), std::vector<size_t>{25});
  EXPECT_EQ(expanded->token_ids.size(), plain->token_ids.size() + 24);
  EXPECT_EQ(without_images(expanded->token_ids), without_images(plain->token_ids));

  proto::EncodeRequest chat;
  chat.op_id = ++op;
  chat.messages = {{"user", "<image>\nCompare with <image> please."}};
  auto chat_plain = encode(chat);
  ASSERT_TRUE(chat_plain.is_ok()) << chat_plain.status().to_string();
  EXPECT_EQ(runs_of(chat_plain->token_ids, 32000), (std::vector<size_t>{1, 1}));
  chat.op_id = ++op;
  chat.image_token_id = 32000;
  chat.image_token_count = 25;
  auto chat_expanded = encode(chat);
  ASSERT_TRUE(chat_expanded.is_ok()) << chat_expanded.status().to_string();
  EXPECT_EQ(runs_of(chat_expanded->token_ids, 32000), (std::vector<size_t>{25, 25}));
  EXPECT_EQ(without_images(chat_expanded->token_ids), without_images(chat_plain->token_ids));

  // Out of range, and an expansion past the limit: error replies.
  text.op_id = ++op;
  text.image_token_count = 0;
  auto zero = encode(text);
  ASSERT_TRUE(zero.is_ok()) << zero.status().to_string();
  EXPECT_NE(zero->error.find("image_token_count 0 is outside [1, 65536]"), std::string::npos)
      << zero->error;
  EXPECT_TRUE(zero->token_ids.empty());
  text.op_id = ++op;
  text.image_token_count = 65536;
  text.text.clear();
  for (int i = 0; i < 70; ++i) text.text += "<image> ";
  auto huge = encode(text);
  ASSERT_TRUE(huge.is_ok()) << huge.status().to_string();
  EXPECT_NE(huge->error.find("over the limit of 4194304"), std::string::npos) << huge->error;
  EXPECT_TRUE(huge->token_ids.empty());
  text.op_id = ++op;
  text.image_token_count = 25;
  auto after = encode(text);
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(after->error, "");
  EXPECT_EQ(runs_of(after->token_ids, 32000), std::vector<size_t>(70, 25));
}

// Pid of the live process whose command line contains both strings (0: none).
int find_process(const std::string& a, const std::string& b) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    std::ifstream st(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    const bool zombie =
        paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
    if (!zombie && cmdline.find(a) != std::string::npos && cmdline.find(b) != std::string::npos) {
      return std::stoi(name);
    }
  }
  return 0;
}

std::string run_generate(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (p != nullptr) pclose(p);
  return out;
}

// `litellama generate --image` in process: the image encoded and its rows placed by the CLI give
// the reference's greedy ids and top logits bit for bit, from one image token, from the run
// already expanded and from "<image>" in a text prompt; several images go in order; bad input
// gets a clear error and a non-zero exit.
TEST(VisionIntegration, GenerateWithImagesInProcessMatchesTheReference) {
  ServiceCluster cluster;
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  const std::string images = testing::env_or("LITELLAMA_SOURCE_DIR", ".") + "/tests/golden/images/";
  const std::vector<int32_t> before = {1, 319, 1967, 29901};
  const std::vector<int32_t> after = {13, 5618, 338, 445};
  const Expected want =
      expected_for(cluster.model_dir(), before, read_image("rgb_37x23.png"), after, 6);
  auto id_list = [](const std::vector<int32_t>& ids) {
    std::string out;
    for (int32_t id : ids) {
      if (!out.empty()) out += ',';
      out += std::to_string(id);
    }
    return out;
  };
  auto generate = [&](const std::string& args) {
    const std::string out = run_generate(
        cluster.bin_dir() + "/litellama generate --model " + cluster.model_dir() +
        " --threads 1 --max-new-tokens 6 --ignore-eos --json " + args + " 2>&1; echo rc=$?");
    return out;
  };
  auto check = [&](const std::string& out, const Expected& expected) {
    const size_t brace = out.find('{');
    ASSERT_NE(brace, std::string::npos) << out;
    const auto j =
        nlohmann::json::parse(out.substr(brace, out.find('\n', brace) - brace), nullptr, false);
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), expected.ids) << out;
    ASSERT_EQ(j["top_logits"].size(), expected.top.size()) << out;
    for (size_t i = 0; i < expected.top.size(); ++i) {
      EXPECT_EQ(j["top_logits"][i][0].get<int32_t>(), expected.top[i].first);
      EXPECT_EQ(j["top_logits"][i][1].get<float>(), expected.top[i].second);  // float32: exact
    }
    EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  };
  std::vector<int32_t> one = before;
  one.push_back(32000);
  one.insert(one.end(), after.begin(), after.end());
  std::vector<int32_t> expanded = before;
  expanded.insert(expanded.end(), 25, 32000);
  expanded.insert(expanded.end(), after.begin(), after.end());
  check(generate("--top-logits 4 --input-ids " + id_list(one) + " --image " + images +
                 "rgb_37x23.png"),
        want);
  check(generate("--top-logits 4 --input-ids " + id_list(expanded) + " --image " + images +
                 "rgb_37x23.png"),
        want);
  // "<image>" of a text prompt is the image token: the same as its ids.
  const std::string from_text = generate("--prompt '<image>' --image " + images + "rgb_37x23.png");
  const std::string from_ids = generate("--input-ids 1,32000 --image " + images + "rgb_37x23.png");
  EXPECT_NE(from_text.find("\"n_prompt_tokens\":26"), std::string::npos) << from_text;
  EXPECT_EQ(from_text.substr(from_text.find("\"output_ids\"")).substr(0, 60),
            from_ids.substr(from_ids.find("\"output_ids\"")).substr(0, 60));
  // Two images, in order: each changes the answer, and their order matters.
  std::vector<int32_t> two = one;
  two.push_back(32000);
  const std::string ab = generate("--input-ids " + id_list(two) + " --image " + images +
                                  "rgb_37x23.png --image " + images + "gray_29x40.jpg");
  const std::string ba = generate("--input-ids " + id_list(two) + " --image " + images +
                                  "gray_29x40.jpg --image " + images + "rgb_37x23.png");
  EXPECT_NE(ab.find("\"n_prompt_tokens\":58"), std::string::npos) << ab;
  EXPECT_NE(ab.find("rc=0"), std::string::npos) << ab;
  EXPECT_NE(ab.substr(ab.find("\"output_ids\"")).substr(0, 60),
            ba.substr(ba.find("\"output_ids\"")).substr(0, 60));

  // Bad input: a clear error, exit 1.
  auto refused = [&](const std::string& args, const std::string& words) {
    const std::string out = generate(args);
    EXPECT_NE(out.find(words), std::string::npos) << args << ": " << out;
    EXPECT_NE(out.find("rc=1"), std::string::npos) << args << ": " << out;
  };
  refused("--input-ids 1,32000,32000,13 --image " + images + "rgb_37x23.png",
          "a run of 2 image tokens");
  refused("--input-ids " + id_list(one) + " --image " + images + "rgb_37x23.png --image " + images +
              "rgb_37x23.png",
          "the prompt has 1 images (image token id 32000) but the request carries 2");
  refused("--input-ids 1,32000 --image /nonexistent.png", "cannot open it");
  refused("--input-ids 1,32000 --image " + images, "not a regular file");
  refused("--input-ids 1,32000 --image " + cluster.model_dir() + "/config.json",
          "not a JPEG or PNG");
  ServiceCluster text_only;
  ASSERT_NO_FATAL_FAILURE(text_only.make_model());
  const std::string no_tower =
      run_generate(cluster.bin_dir() + "/litellama generate --model " + text_only.model_dir() +
                   " --input-ids 1,2 --image " + images + "rgb_37x23.png 2>&1; echo rc=$?");
  EXPECT_NE(no_tower.find("needs a LLaVA checkpoint"), std::string::npos) << no_tower;
  EXPECT_NE(no_tower.find("rc=1"), std::string::npos) << no_tower;
}

// `litellama serve` starts the vision service for a LLaVA checkpoint; `litellama generate
// --server --image` gets the in-process engine's ids; the vision process killed is restarted by
// serve, the worker (not restarted) reads the new process's pool, and images work again.
TEST(VisionIntegration, ServeStartsAndRestartsTheVisionServiceWithoutTheWorker) {
  ServiceCluster cluster;
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  ASSERT_NO_FATAL_FAILURE(add_chat_template(cluster.model_dir()));
  const std::string run = (cluster.dir() / "serve-run").string();
  auto serve = net::ChildProcess::spawn(
      {cluster.bin_dir() + "/litellama", "serve", "--port", "0", "--model", cluster.model_dir(),
       "--run-dir", run, "--metrics-port", "0", "--kv-slots", "1024", "--threads", "1",
       "--vision-pool-bytes", "65536", "--log-dir", (cluster.dir() / "logs").string()},
      (cluster.dir() / "serve.log").string());
  ASSERT_TRUE(serve.is_ok());
  auto client = net::SchedulerClient::connect(net::ipc_endpoint(run, "client"));
  ASSERT_TRUE(client.is_ok());
  auto vision_up = [&] {
    auto info = (*client)->server_info(1000);
    return info.is_ok() && info->vision_up;
  };
  ASSERT_TRUE((*client)->wait_ready(30000).is_ok());
  ASSERT_TRUE(testing::poll_until(vision_up, 20000));

  const std::vector<int32_t> before = {1, 319, 1967, 29901};
  const std::vector<int32_t> after = {13, 5618, 338, 445};
  const Expected want =
      expected_for(cluster.model_dir(), before, read_image("rgb_37x23.png"), after, 5);
  std::string ids;
  for (int32_t id : before) ids += std::to_string(id) + ",";
  ids += "32000";
  for (int32_t id : after) ids += "," + std::to_string(id);
  const std::string image =
      testing::env_or("LITELLAMA_SOURCE_DIR", ".") + "/tests/golden/images/rgb_37x23.png";
  const std::string generate = cluster.bin_dir() + "/litellama generate --server " + run +
                               " --input-ids " + ids + " --image " + image +
                               " --max-new-tokens 5 --ignore-eos --json";
  auto ids_of = [](const std::string& out) {
    std::vector<int32_t> got;
    const size_t at = out.find("\"output_ids\":[");
    if (at == std::string::npos) return got;
    std::stringstream in(out.substr(at + 14, out.find(']', at) - at - 14));
    std::string item;
    while (std::getline(in, item, ',')) got.push_back(std::stoi(item));
    return got;
  };
  const std::string first = run_generate(generate);
  EXPECT_EQ(ids_of(first), want.ids) << first;
  // The same command in process (no --server): the same ids.
  const std::string in_process =
      run_generate(cluster.bin_dir() + "/litellama generate --model " + cluster.model_dir() +
                   " --threads 1 --input-ids " + ids + " --image " + image +
                   " --max-new-tokens 5 --ignore-eos --json");
  EXPECT_EQ(ids_of(in_process), ids_of(first)) << in_process;

  const int worker = find_process("litellama-worker", run);
  const int vision = find_process("litellama-vision", run);
  ASSERT_GT(worker, 0);
  ASSERT_GT(vision, 0);
  kill(vision, SIGKILL);
  ASSERT_TRUE(testing::poll_until(
      [&] {
        return find_process("litellama-vision", run) != vision &&
               find_process("litellama-vision", run) > 0;
      },
      20000));
  ASSERT_TRUE(testing::poll_until(vision_up, 20000));
  const std::string again = run_generate(generate);
  EXPECT_EQ(ids_of(again), want.ids) << again;
  EXPECT_EQ(find_process("litellama-worker", run), worker) << "the worker was restarted";

  // litellama chat --image: two turns, both sending the image with the history.
  const std::string chat =
      run_generate(cluster.bin_dir() + "/litellama chat --server " + run + " --image " + image +
                   " -m 'What is this?' -m 'And now?'" + " --max-new-tokens 3 2>&1; echo rc=$?");
  EXPECT_NE(chat.find("rc=0"), std::string::npos) << chat;
  const std::string no_file = run_generate(cluster.bin_dir() + "/litellama chat --server " + run +
                                           " --image /nonexistent.png -m hi 2>&1; echo rc=$?");
  EXPECT_NE(no_file.find("cannot open it"), std::string::npos) << no_file;
  EXPECT_EQ(no_file.find("rc=0"), std::string::npos) << no_file;
  serve->stop(10000);
}

}  // namespace
}  // namespace litellama
