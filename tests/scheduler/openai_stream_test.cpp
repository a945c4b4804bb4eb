// The stream chunks the API writes as text are the bytes a JSON tree of the same chunk dumps to:
// every combination of chat/completions, role, text (also invalid UTF-8 and characters JSON
// escapes), finish reason, logprobs and include_usage, against a tree built here.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/api/openai_logprobs.h"
#include "services/api/openai_protocol.h"

namespace litellama::api {
namespace {

using ojson = nlohmann::ordered_json;

std::string tree_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                       int32_t index, const std::string* delta_text, bool role,
                       const std::string& finish_reason, const std::vector<TokenLogprob>* logprobs,
                       size_t text_offset) {
  ojson c;
  c["index"] = index;
  if (request.chat) {
    ojson delta = ojson::object();
    if (role) delta["role"] = "assistant";
    if (delta_text) delta["content"] = *delta_text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = delta_text ? *delta_text : std::string();
  }
  if (request.logprobs && logprobs != nullptr) {
    c["logprobs"] = request.chat ? chat_logprobs_json(*logprobs)
                                 : completion_logprobs_json(*logprobs, text_offset);
  } else {
    c["logprobs"] = nullptr;
  }
  c["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson body = {{"id", id},
                {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", request.model},
                {"choices", ojson::array({std::move(c)})}};
  if (request.include_usage) body["usage"] = nullptr;
  return "data: " + body.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {
      "a",    " b",       "\"",           "\\",   "\n",   "\t",
      "\x01", "\xc3\xa9", "\xe2\x82\xac", "\xff", "\xc3", "\xf0\x9f\x98\x80",
      "</s>", "/"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 6)(rng);
  for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
  return s;
}

TEST(OpenAiStream, ChunkTextMatchesTheJsonTree) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    ParsedRequest request;
    request.chat = rng() % 2 == 0;
    request.logprobs = rng() % 3 == 0;
    request.include_usage = rng() % 2 == 0;
    request.model = rng() % 4 == 0 ? "m\"odel\xff" : "llama-3.2-1b";
    const std::string id = trial % 5 == 0 ? "chatcmpl-\"x\"" : "cmpl-00ff";
    const int64_t created = 1700000000 + trial;
    const int32_t index = static_cast<int32_t>(rng() % 16);
    const std::string text = random_text(rng);
    const bool has_text = rng() % 4 != 0;
    const bool role = rng() % 3 == 0;
    const std::string finish = rng() % 3 == 0 ? (rng() % 2 ? "length" : "stop") : "";
    std::vector<TokenLogprob> logprobs;
    for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i) {
      TokenLogprob t;
      t.bytes = random_text(rng);
      t.logprob = -static_cast<float>(rng() % 1000) / 100.0f;
      t.top = {{random_text(rng), -0.5f}, {random_text(rng), -1.25f}};
      logprobs.push_back(t);
    }
    const std::vector<TokenLogprob>* lp = rng() % 2 == 0 ? &logprobs : nullptr;
    const size_t offset = rng() % 40;
    const std::string* delta = has_text ? &text : nullptr;
    EXPECT_EQ(stream_chunk(request, id, created, index, delta, role, finish, lp, offset),
              tree_chunk(request, id, created, index, delta, role, finish, lp, offset))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace litellama::api
