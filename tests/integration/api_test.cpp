// The OpenAI-compatible HTTP API of the scheduler, over raw HTTP against the real processes:
// every endpoint, the SSE bytes, the request fields, every error code, disconnects.
#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/http_client.h"
#include "tests/integration/service_cluster.h"

namespace litellama {
namespace {

using nlohmann::json;
using testing::free_tcp_port;
using testing::http;
using testing::HttpResponse;
using testing::metric_value;
using testing::ServiceCluster;

constexpr const char* kKey = "sk-test-key";
constexpr const char* kModel = "tiny";
constexpr int kMaxModelLen = 256;
constexpr int kMaxRequestBytes = 64 * 1024;
constexpr int kMaxImageRequestBytes = 8 << 20;
constexpr int kMaxImageBytes = 11 << 19;  // 5.5 MiB

// The events of an SSE body: each "data: X\n\n" gives X; fails on any other framing.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event in: " << body;
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << event;
    events.push_back(event.substr(6));
    pos = end + 2;
  }
  return events;
}

class ApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new ServiceCluster();
    port_ = free_tcp_port();
    const std::string key_file = (cluster_->dir() / "key").string();
    std::ofstream(key_file) << kKey << "\n";
    std::filesystem::create_directories(media_dir());
    cluster_->add_scheduler_args(
        {"--api-listen", "127.0.0.1:" + std::to_string(port_), "--api-key-file", key_file,
         "--served-model-name", kModel, "--max-model-len", std::to_string(kMaxModelLen),
         "--max-request-bytes", std::to_string(kMaxRequestBytes), "--max-image-request-bytes",
         std::to_string(kMaxImageRequestBytes), "--max-image-bytes", std::to_string(kMaxImageBytes),
         "--allowed-local-media-path", media_dir()});
    cluster_->start_all();
    // The API learns readiness from the scheduler a moment later.
    for (int i = 0; i < 100 && get("/ready").status != 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static HttpResponse get(const std::string& path) {
    return http(port_, "GET", path, "", {std::string("Authorization: Bearer ") + kKey});
  }
  static HttpResponse post(const std::string& path, const std::string& body) {
    return http(port_, "POST", path, body, {std::string("Authorization: Bearer ") + kKey});
  }
  static HttpResponse post(const std::string& path, const json& body) {
    return post(path, body.dump());
  }
  // Asserts an OpenAI error envelope with this status (and param/code when given).
  static void expect_error(const HttpResponse& r, int status, const std::string& param = "",
                           const std::string& code = "") {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
    EXPECT_TRUE(e["type"].is_string()) << r.body;
    EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.body;
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << r.body;
    }
    if (!code.empty()) {
      EXPECT_EQ(e["code"], code) << r.body;
    }
  }
  // The directory file:// image URLs may name (--allowed-local-media-path).
  static std::string media_dir() { return (cluster_->dir() / "media").string(); }
  // A chat body whose user message is an image_url part with `url` and then `text`.
  static json image_body(const std::string& url, const std::string& text = "What is this?") {
    return json{{"model", kModel},
                {"max_tokens", 2},
                {"messages",
                 json::array({{{"role", "user"},
                               {"content",
                                json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                             {{"type", "text"}, {"text", text}}})}}})}};
  }
  static json chat_body(const std::string& text, int max_tokens) {
    return json{{"model", kModel},
                {"messages", json::array({{{"role", "user"}, {"content", text}}})},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"ignore_eos", true}};
  }

  static ServiceCluster* cluster_;
  static int port_;
};

ServiceCluster* ApiTest::cluster_ = nullptr;
int ApiTest::port_ = 0;

TEST_F(ApiTest, HealthIsOpenEverythingElseNeedsTheKey) {
  const HttpResponse health = http(port_, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  for (const char* path : {"/ready", "/metrics", "/v1/models"}) {
    expect_error(http(port_, "GET", path), 401, "", "invalid_api_key");
    expect_error(http(port_, "GET", path, "", {"Authorization: Bearer wrong"}), 401, "",
                 "invalid_api_key");
  }
  expect_error(http(port_, "POST", "/v1/chat/completions", chat_body("hi", 2).dump()), 401);
  // The chat page is open (its API calls carry the key) and is the embedded HTML.
  const HttpResponse page = http(port_, "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.headers.find("text/html"), std::string::npos);
  EXPECT_NE(page.body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_EQ(page.body.find("https://"), std::string::npos) << "nothing from a CDN";
  EXPECT_EQ(get("/ready").status, 200);
  const HttpResponse metrics = get("/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("litellama_scheduler_kv_slots_used"), std::string::npos);
}

TEST_F(ApiTest, ModelsListsTheServedName) {
  const HttpResponse r = get("/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], kModel);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], kMaxModelLen);
}

TEST_F(ApiTest, ChatCompletionCarriesUsage) {
  const HttpResponse r = post("/v1/chat/completions", chat_body("Hello there", 5));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(), j["usage"]["prompt_tokens"].get<int>() + 5);
}

// usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served. The same
// conversation again finds all of its prompt but the last token cached.
TEST_F(ApiTest, UsageCountsCachedPromptTokens) {
  const json body = chat_body("A question the cache will see twice, word for word", 4);
  const HttpResponse first = post("/v1/chat/completions", body);
  ASSERT_EQ(first.status, 200) << first.body;
  const json a = json::parse(first.body);
  const int prompt = a.at("usage").at("prompt_tokens").get<int>();
  ASSERT_GT(prompt, 3);
  // Another test on the same server may have cached the chat template's opening tokens, never
  // this question.
  EXPECT_LT(a.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>(), prompt - 6);
  const HttpResponse second = post("/v1/chat/completions", body);
  ASSERT_EQ(second.status, 200) << second.body;
  const json b = json::parse(second.body);
  EXPECT_EQ(b.at("usage").at("prompt_tokens"), prompt);
  EXPECT_EQ(b.at("usage").at("prompt_tokens_details").at("cached_tokens"), prompt - 1);
}

TEST_F(ApiTest, CompletionsDefaultToSixteenTokensAndEcho) {
  json body = {{"model", kModel},
               {"prompt", "The sky is"},
               {"ignore_eos", true},
               {"temperature", 0},
               {"echo", true}};
  const HttpResponse r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().rfind("The sky is", 0), 0u);
  // A list of token-id prompts: one choice each.
  body = {{"model", kModel},
          {"prompt", json::array({json::array({1, 2, 3}), json::array({4, 5})})},
          {"max_tokens", 2},
          {"ignore_eos", true}};
  const HttpResponse ids = post("/v1/completions", body);
  ASSERT_EQ(ids.status, 200) << ids.body;
  const json k = json::parse(ids.body);
  ASSERT_EQ(k["choices"].size(), 2u);
  EXPECT_EQ(k["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(k["usage"]["completion_tokens"], 4);
}

TEST_F(ApiTest, ChatStreamIsOpenAiSse) {
  json body = chat_body("Tell me a story", 6);
  const HttpResponse whole = post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string expected = json::parse(whole.body)["choices"][0]["message"]["content"];

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const HttpResponse r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos) << r.headers;
  EXPECT_TRUE(r.chunked);
  const std::vector<std::string> events = sse_events(r.body);
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string id;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id) << "every chunk carries the same id";
    if (i + 2 == events.size()) {
      // The usage chunk: empty choices.
      EXPECT_TRUE(c["choices"].empty()) << events[i];
      EXPECT_EQ(c["usage"]["completion_tokens"], 6);
      continue;
    }
    EXPECT_TRUE(c["usage"].is_null()) << events[i];
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant") << events[i];
    } else {
      EXPECT_FALSE(ch["delta"].contains("role")) << events[i];
    }
    if (i + 3 == events.size()) {
      EXPECT_EQ(ch["finish_reason"], "length") << events[i];
    } else {
      EXPECT_TRUE(ch["finish_reason"].is_null()) << events[i];
    }
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected);
}

TEST_F(ApiTest, CompletionsStreamEndsWithDone) {
  const json body = {{"model", kModel},
                     {"prompt", "Once"},
                     {"max_tokens", 3},
                     {"ignore_eos", true},
                     {"stream", true}};
  const HttpResponse r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200);
  const auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["object"], "text_completion");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last.contains("usage")) << "no usage without stream_options.include_usage";
}

TEST_F(ApiTest, SeedAndNSampleChoiceIWithSeedPlusI) {
  json body = chat_body("Pick a word", 8);
  body["temperature"] = 1.0;
  body["seed"] = 1234;
  body["n"] = 2;
  const HttpResponse a = post("/v1/chat/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  const json ja = json::parse(a.body);
  ASSERT_EQ(ja["choices"].size(), 2u);
  EXPECT_EQ(ja["choices"][1]["index"], 1);
  EXPECT_EQ(ja["usage"]["completion_tokens"], 16);
  const HttpResponse again = post("/v1/chat/completions", body);
  EXPECT_EQ(json::parse(again.body)["choices"], ja["choices"]) << "same seed, same answer";
  body["n"] = 1;
  body["seed"] = 1235;
  const json one = json::parse(post("/v1/chat/completions", body).body);
  EXPECT_EQ(one["choices"][0]["message"], ja["choices"][1]["message"]);
}

TEST_F(ApiTest, StopStringEndsTheText) {
  json body = {{"model", kModel},
               {"prompt", "Numbers:"},
               {"max_tokens", 12},
               {"ignore_eos", true},
               {"temperature", 0}};
  const std::string full = json::parse(post("/v1/completions", body).body)["choices"][0]["text"];
  // An ASCII character past the start (a stop string must be whole characters).
  size_t k = 1;
  while (k < full.size() && static_cast<unsigned char>(full[k]) >= 0x80) ++k;
  ASSERT_LT(k, full.size()) << full;
  const std::string stop = full.substr(k, 1);
  body["stop"] = json::array({stop});
  const json j = json::parse(post("/v1/completions", body).body);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ApiTest, ErrorsUseTheEnvelope) {
  expect_error(post("/v1/chat/completions", std::string("{not json")), 400);
  expect_error(post("/v1/chat/completions", std::string("{\"model\": \"tiny\xff\"}")), 400);
  expect_error(post("/v1/chat/completions", std::string("[1, 2]")), 400);
  json body = chat_body("hi", 2);
  body["model"] = "gpt-4";
  expect_error(post("/v1/chat/completions", body), 404, "model", "model_not_found");
  expect_error(get("/v1/nothing"), 404);
  expect_error(get("/v1/chat/completions"), 405);
  expect_error(post("/v1/models", std::string("{}")), 405);
  for (const char* field : {"tools", "response_format", "logit_bias"}) {
    body = chat_body("hi", 2);
    body[field] = json::array({1});
    expect_error(post("/v1/chat/completions", body), 400, field);
  }
  body = chat_body("hi", 2);
  body["temperature"] = "hot";
  expect_error(post("/v1/chat/completions", body), 400, "temperature");
  body = chat_body("hi", 2);
  body["n"] = 17;
  expect_error(post("/v1/chat/completions", body), 400, "n");
  body = chat_body("hi", 2);
  body["messages"][0]["role"] = "tool";
  expect_error(post("/v1/chat/completions", body), 400, "messages[0].role");
  body = chat_body("hi", 2);
  body["unknown_field"] = 1;  // ignored
  EXPECT_EQ(post("/v1/chat/completions", body).status, 200);
  // 413: over --max-request-bytes.
  body = chat_body(std::string(kMaxRequestBytes, 'a'), 2);
  expect_error(post("/v1/chat/completions", body), 413);
}

// Requests with images on a server without a vision service: an image the API takes reaches the
// scheduler, which refuses it for want of one (503 naming it); what the API refuses is 400 or 413
// before that.
TEST_F(ApiTest, ImageBodiesAndLocalFiles) {
  auto reaches_scheduler = [](const HttpResponse& r) {
    EXPECT_EQ(r.status, 503) << r.body.substr(0, 500);
    EXPECT_NE(r.body.find("no vision service"), std::string::npos) << r.body.substr(0, 500);
  };
  // A data: URL image of 5 MiB: its body is far over --max-request-bytes (64 KiB) and within
  // --max-image-request-bytes (8 MiB).
  const std::string image_url = "data:image/png;base64," + std::string((5 << 20) / 3 * 4, 'W');
  reaches_scheduler(post("/v1/chat/completions", image_body(image_url)));
  // Over --max-image-request-bytes: 413 naming it.
  const HttpResponse huge =
      post("/v1/chat/completions",
           image_body("data:image/png;base64," + std::string(size_t{9} << 20, 'W')));
  expect_error(huge, 413, "", "request_too_large");
  EXPECT_NE(huge.body.find("--max-image-request-bytes"), std::string::npos) << huge.body;
  // The text stays bounded by --max-request-bytes, images or not.
  const HttpResponse long_text =
      post("/v1/chat/completions", image_body(image_url, std::string(kMaxRequestBytes, 'a')));
  expect_error(long_text, 413, "", "request_too_large");
  EXPECT_NE(long_text.body.find("--max-request-bytes"), std::string::npos) << long_text.body;
  EXPECT_NE(long_text.body.find("text"), std::string::npos) << long_text.body;
  // An image over --max-image-bytes (5.5 MiB) within the body limit: 413 naming it.
  const HttpResponse big_image =
      post("/v1/chat/completions",
           image_body("data:image/png;base64," + std::string((23 << 18) / 3 * 4, 'W')));
  expect_error(big_image, 413, "messages[0].content", "request_too_large");
  EXPECT_NE(big_image.body.find("--max-image-bytes"), std::string::npos) << big_image.body;
  // Completions take no images: the body limit stays --max-request-bytes.
  const HttpResponse completions =
      post("/v1/completions", json{{"model", kModel}, {"prompt", image_url}, {"max_tokens", 1}});
  expect_error(completions, 413, "", "request_too_large");

  // No network fetch, ever.
  for (const char* url : {"http://127.0.0.1:1/cat.png", "https://example.invalid/cat.png"}) {
    const HttpResponse remote = post("/v1/chat/completions", image_body(url));
    expect_error(remote, 400, "messages[0].content");
    EXPECT_NE(remote.body.find("fetches no URL"), std::string::npos) << remote.body;
  }

  // file:// URLs under --allowed-local-media-path only.
  namespace fs = std::filesystem;
  const fs::path media = media_dir();
  const fs::path outside = cluster_->dir() / "outside.png";
  std::ofstream(media / "cat.png", std::ios::binary) << "\x89PNG not really";
  std::ofstream(outside, std::ios::binary) << "\x89PNG outside";
  fs::create_directories(media / "sub");
  fs::create_symlink(outside, media / "escape.png");
  fs::create_symlink(media / "cat.png", media / "alias.png");
  fs::create_directory_symlink(cluster_->dir(), media / "up");
  ASSERT_EQ(mkfifo((media / "fifo.png").c_str(), 0600), 0);
  std::ofstream(media / "big.png") << "x";
  fs::resize_file(media / "big.png", kMaxImageBytes + 1);
  const std::string base = "file://" + media.string();
  reaches_scheduler(post("/v1/chat/completions", image_body(base + "/cat.png")));
  reaches_scheduler(post("/v1/chat/completions", image_body(base + "/alias.png")));
  reaches_scheduler(post("/v1/chat/completions", image_body(base + "/sub/../c%61t.png")));
  reaches_scheduler(
      post("/v1/chat/completions", image_body("file://localhost" + media.string() + "/cat.png")));
  auto refused = [&](const std::string& url, int status, const std::string& words) {
    const HttpResponse r = post("/v1/chat/completions", image_body(url));
    expect_error(r, status, "messages[0].content");
    EXPECT_NE(r.body.find(words), std::string::npos) << url << ": " << r.body;
    EXPECT_EQ(r.body.find(cluster_->dir().string()), std::string::npos)
        << "the path is echoed: " << r.body;
  };
  refused("file://" + outside.string(), 400, "outside the directory");
  refused(base + "/../outside.png", 400, "outside the directory");
  refused(base + "/escape.png", 400, "outside the directory");
  refused(base + "/up/outside.png", 400, "outside the directory");
  refused("file:///etc/passwd", 400, "outside the directory");
  refused(base + "/sub", 400, "not a regular file");
  refused(base + "/fifo.png", 400, "not a regular file");
  refused(base + "/missing.png", 400, "names no file");
  refused(base + "/big.png", 413, "--max-image-bytes");
  refused("file://otherhost/cat.png", 400, "absolute path on this host");
  refused(base + "/cat.png?x=1", 400, "no query");
  refused(base + "/cat%00.png", 400, "percent-escape");
}

// Logprobs (of the raw distribution) in OpenAI's chat format: one entry per generated token,
// each with its bytes and top_logprobs most likely alternatives (most likely first, logprobs
// that are a distribution's: <= 0, decreasing); greedy picks the most likely, so its token is its
// first alternative. The stream carries the same values as the whole response.
TEST_F(ApiTest, ChatLogprobsStreamingAndNot) {
  json body = chat_body("Tell me", 6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const HttpResponse r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array()) << r.body;
  ASSERT_EQ(content.size(), 6u) << r.body;
  std::string joined;
  bool plain_text = true;  // no special token and no piece of a character
  for (const json& t : content) {
    ASSERT_TRUE(t["logprob"].is_number()) << t;
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u) << t;
    double prev = 0.0;
    for (const json& alt : t["top_logprobs"]) {
      EXPECT_LE(alt["logprob"].get<double>(), prev + 1e-6) << t;
      prev = alt["logprob"].get<double>();
      EXPECT_TRUE(alt["token"].is_string() && alt["bytes"].is_array()) << alt;
    }
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]) << t;
    EXPECT_NEAR(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>(), 1e-6);
    std::string bytes;
    for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
    if (t["token"].get<std::string>().rfind("bytes:", 0) != 0) {
      EXPECT_EQ(bytes, t["token"].get<std::string>());
    } else {
      plain_text = false;
    }
    if (bytes.find("<|") != std::string::npos) plain_text = false;
    joined += bytes;
  }
  // The tokens' bytes spell the text.
  if (plain_text) {
    EXPECT_EQ(joined, j["choices"][0]["message"]["content"].get<std::string>());
  }

  body["stream"] = true;
  const HttpResponse s = post("/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<json> streamed;
  for (const std::string& e : sse_events(s.body)) {
    if (e == "[DONE]") break;
    const json c = json::parse(e);
    const json& lp = c["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const json& t : lp["content"]) streamed.push_back(t);
  }
  ASSERT_EQ(streamed.size(), content.size()) << s.body;
  for (size_t i = 0; i < streamed.size(); ++i) {
    EXPECT_EQ(streamed[i]["token"], content[i]["token"]);
    EXPECT_NEAR(streamed[i]["logprob"].get<double>(), content[i]["logprob"].get<double>(), 1e-6);
  }

  // Sampling with a temperature and penalties leaves the logprobs of the raw distribution: the
  // most likely alternatives of the first position are the same as greedy's.
  body["stream"] = false;
  body["temperature"] = 1.5;
  body["presence_penalty"] = 1.0;
  body["seed"] = 5;
  const json hot = json::parse(post("/v1/chat/completions", body).body);
  const json& first = hot["choices"][0]["logprobs"]["content"][0];
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(first["top_logprobs"][k]["token"], content[0]["top_logprobs"][k]["token"]);
    EXPECT_NEAR(first["top_logprobs"][k]["logprob"].get<double>(),
                content[0]["top_logprobs"][k]["logprob"].get<double>(), 1e-5);
  }

  // Without logprobs: null.
  const json plain = json::parse(post("/v1/chat/completions", chat_body("Tell me", 2)).body);
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

// Completions take logprobs as a count and answer in the legacy format; with echo only the
// generated tokens are listed (the prompt's have no logprobs here), offsets counting from the
// end of the echoed prompt.
TEST_F(ApiTest, CompletionsLogprobsLegacyFormatStreamingAndNot) {
  const std::string prompt = "Once upon";
  json body = {{"model", kModel},    {"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", 2},    {"echo", true}};
  const HttpResponse r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << r.body;
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  EXPECT_EQ(lp["text_offset"][0], prompt.size());
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    ASSERT_TRUE(lp["top_logprobs"][i].is_object());
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    // Greedy: the token is among its alternatives with the same logprob.
    const std::string token = lp["tokens"][i];
    ASSERT_TRUE(lp["top_logprobs"][i].contains(token)) << lp;
    EXPECT_NEAR(lp["top_logprobs"][i][token].get<double>(), lp["token_logprobs"][i].get<double>(),
                1e-6);
  }
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text.rfind(prompt, 0), 0u);

  body["stream"] = true;
  const HttpResponse s = post("/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<double> streamed;
  std::vector<int64_t> offsets;
  for (const std::string& e : sse_events(s.body)) {
    if (e == "[DONE]") break;
    const json event = json::parse(e);
    const json& c = event["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const json& v : c["logprobs"]["token_logprobs"]) streamed.push_back(v.get<double>());
    for (const json& v : c["logprobs"]["text_offset"]) offsets.push_back(v.get<int64_t>());
  }
  ASSERT_EQ(streamed.size(), 5u) << s.body;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(streamed[i], lp["token_logprobs"][i].get<double>(), 1e-6);
    EXPECT_EQ(offsets[i], lp["text_offset"][i].get<int64_t>());
  }
}

TEST_F(ApiTest, LogprobsFieldErrorsNameTheParam) {
  json body = chat_body("hi", 2);
  body["logprobs"] = true;
  body["top_logprobs"] = 21;
  expect_error(post("/v1/chat/completions", body), 400, "top_logprobs");
  body = chat_body("hi", 2);
  body["top_logprobs"] = 2;  // without logprobs
  expect_error(post("/v1/chat/completions", body), 400, "top_logprobs");
  body = chat_body("hi", 2);
  body["logprobs"] = 3;  // chat takes a boolean
  expect_error(post("/v1/chat/completions", body), 400, "logprobs");
  body = {{"model", kModel}, {"prompt", "hi"}, {"logprobs", 21}};
  expect_error(post("/v1/completions", body), 400, "logprobs");
  body = {{"model", kModel}, {"prompt", "hi"}, {"logprobs", true}};
  expect_error(post("/v1/completions", body), 400, "logprobs");
}

TEST_F(ApiTest, ContextLengthExceededNamesBothLengths) {
  const HttpResponse r = post("/v1/chat/completions", chat_body("hi", kMaxModelLen + 10));
  expect_error(r, 400, "messages", "context_length_exceeded");
  const std::string message = json::parse(r.body)["error"]["message"];
  EXPECT_NE(message.find(std::to_string(kMaxModelLen)), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(kMaxModelLen + 10)), std::string::npos) << message;
  // In a stream the same error comes as the HTTP status: nothing had been sent yet.
  json body = chat_body("hi", kMaxModelLen + 10);
  body["stream"] = true;
  expect_error(post("/v1/chat/completions", body), 400, "messages", "context_length_exceeded");
  // Chat without max_tokens gets the rest of the context.
  body = chat_body("hi", 1);
  body.erase("max_tokens");
  const HttpResponse rest = post("/v1/chat/completions", body);
  ASSERT_EQ(rest.status, 200) << rest.body;
  EXPECT_EQ(json::parse(rest.body)["usage"]["total_tokens"], kMaxModelLen);
}

// A client that goes away mid-stream: its request is aborted and its KV freed within 1 s.
TEST_F(ApiTest, DisconnectAbortsAndFreesKv) {
  json body = chat_body("Write forever", 200);
  body["stream"] = true;
  const int fd = testing::connect_local(port_);
  ASSERT_GE(fd, 0);
  const std::string req = testing::request_text("POST", "/v1/chat/completions", body.dump(),
                                                {std::string("Authorization: Bearer ") + kKey});
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);  // the stream has begun
  EXPECT_TRUE(cluster_->wait_metric_above("litellama_scheduler_kv_slots_used", 0));
  close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(cluster_->wait_metric("litellama_scheduler_kv_slots_used", 0, 1000));
  EXPECT_TRUE(cluster_->wait_metric("litellama_scheduler_requests_running", 0, 1000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
}

// litellama bench --base-url drives the API like any OpenAI-compatible server.
TEST_F(ApiTest, BenchDrivesTheHttpApi) {
  const std::string cmd = cluster_->bin_dir() +
                          "/litellama bench --base-url http://127.0.0.1:" + std::to_string(port_) +
                          "/v1 --api-key " + kKey +
                          " -n 4 -c 2 --input-len 8 --output-len 4 --vocab-size 500 --json "
                          "2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["n_completed"], 4);
  EXPECT_EQ(j["input_tokens"], 32);
  EXPECT_EQ(j["output_tokens"], 16);
  EXPECT_GT(j["ttft"]["p50_ms"].get<double>(), 0.0);
  EXPECT_GT(j["tpot"]["p50_ms"].get<double>(), 0.0);
}

// 503 before the worker is up; a chat template that cannot render still serves completions
// (the tokenizer warns at load; chat gets 400 in the same words); an error after the stream
// began is sent in-band.
TEST(ApiServiceTest, NotReadyIs503TemplateErrorsAre400LateErrorsAreInBand) {
  ServiceCluster cluster;
  const int port = free_tcp_port();
  cluster.add_scheduler_args({"--api-listen", "127.0.0.1:" + std::to_string(port)});
  cluster.make_model();
  cluster.start_scheduler();
  const std::string template_file = (cluster.dir() / "broken.jinja").string();
  std::ofstream(template_file) << "{{ raise_exception('this template refuses every chat') }}";
  cluster.start_process(
      "tokenizer",
      {cluster.bin_dir() + "/litellama-tokenizer", "--model", cluster.model_dir(), "--run-dir",
       cluster.run_dir(), "--metrics", "127.0.0.1:" + std::to_string(cluster.tokenizer_port()),
       "--heartbeat-ms", "50", "--peer-timeout-ms", "600", "--chat-template", template_file});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(http(port, "GET", "/ready").status, 503);
  const HttpResponse early =
      http(port, "POST", "/v1/completions", R"({"model": "x", "prompt": "hi"})");
  EXPECT_EQ(early.status, 503) << early.body;
  cluster.start_worker();
  cluster.wait_ready();
  for (int i = 0; i < 100 && http(port, "GET", "/ready").status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const json models = json::parse(http(port, "GET", "/v1/models").body, nullptr, false);
  ASSERT_TRUE(models.is_object() && models.contains("data")) << models;
  const std::string name = models["data"][0]["id"];
  EXPECT_NE(cluster.log("tokenizer").find("this template refuses every chat"), std::string::npos)
      << cluster.log("tokenizer");
  const json chat = {{"model", name},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  const HttpResponse refused = http(port, "POST", "/v1/chat/completions", chat.dump());
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("this template refuses every chat"), std::string::npos)
      << refused.body;
  EXPECT_EQ(json::parse(refused.body)["error"]["param"], "messages") << refused.body;
  // Without --allowed-local-media-path a file:// image URL is refused, naming the flag.
  const json local = {
      {"model", name},
      {"messages",
       json::array(
           {{{"role", "user"},
             {"content", json::array({{{"type", "image_url"},
                                       {"image_url", {{"url", "file:///tmp/cat.png"}}}}})}}})}};
  const HttpResponse no_files = http(port, "POST", "/v1/chat/completions", local.dump());
  EXPECT_EQ(no_files.status, 400) << no_files.body;
  EXPECT_NE(no_files.body.find("--allowed-local-media-path"), std::string::npos) << no_files.body;
  EXPECT_EQ(http(port, "POST", "/v1/completions",
                 json{{"model", name}, {"prompt", "hi"}, {"max_tokens", 2}}.dump())
                .status,
            200);
  const json body = {{"model", name},
                     {"prompt", "Go"},
                     {"max_tokens", 200},
                     {"ignore_eos", true},
                     {"stream", true}};
  const int fd = testing::connect_local(port);
  const std::string req = testing::request_text("POST", "/v1/completions", body.dump(), {});
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string raw;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof(buf));
  ASSERT_GT(n, 0);
  raw.append(buf, static_cast<size_t>(n));
  cluster.process("worker").signal(SIGKILL);
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const HttpResponse r = testing::parse_response(raw);
  ASSERT_EQ(r.status, 200) << raw;
  const auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 2u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const json error = json::parse(events[events.size() - 2]);
  ASSERT_TRUE(error.contains("error")) << r.body;
  EXPECT_EQ(error["error"]["type"], "service_unavailable");
}

}  // namespace
}  // namespace litellama
