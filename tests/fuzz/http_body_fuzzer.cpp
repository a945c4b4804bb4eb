// Fuzz target: request bodies of the HTTP API (services/api/openai_protocol.h). The first byte
// picks /v1/chat/completions (odd) or /v1/completions (even); the rest is the body. Properties:
// parsing returns a request or an OpenAI error, never crashes; an error has a message, a 4xx
// status and a JSON envelope; an accepted request has 1 to 16 choices per prompt, one
// GenerateRequest per choice with a prompt index each, and every response the server would
// build from it (whole body and stream chunks) is valid JSON.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "services/api/openai_protocol.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace litellama;
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  api::ParseContext context;
  context.served_model_name = "m";
  api::ParsedRequest request;
  api::ApiError error;
  if (!api::parse_request(body, chat, context, &request, &error)) {
    FUZZ_CHECK(!error.message.empty(), "an error without a message");
    FUZZ_CHECK(error.http_status >= 400 && error.http_status < 500, "a non-4xx parse error");
    const auto envelope = nlohmann::json::parse(api::error_body(error), nullptr, false);
    FUZZ_CHECK(!envelope.is_discarded() && envelope.contains("error"), "a malformed envelope");
    return 0;
  }
  FUZZ_CHECK(request.chat == chat, "parsed as the other endpoint");
  FUZZ_CHECK(request.n >= 1 && request.n <= context.max_n, "n out of range");
  FUZZ_CHECK(!request.generate.empty(), "no choice");
  FUZZ_CHECK(request.prompt_index.size() == request.generate.size(), "a choice without a prompt");
  FUZZ_CHECK(request.generate.size() % static_cast<size_t>(request.n) == 0,
             "choices not a multiple of n");
  std::vector<api::ChoiceResult> results(request.generate.size());
  for (auto& r : results) {
    r.text = "x";
    r.finish_reason = "stop";
  }
  const auto whole =
      nlohmann::json::parse(api::completion_body(request, "id", 0, results), nullptr, false);
  FUZZ_CHECK(!whole.is_discarded(), "a response body that is not JSON");
  const std::string text = "y";
  const std::string chunk = api::stream_chunk(request, "id", 0, 0, &text, true, "");
  FUZZ_CHECK(chunk.rfind("data: ", 0) == 0 && chunk.size() >= 8, "a malformed stream event");
  const auto event = nlohmann::json::parse(chunk.substr(6), nullptr, false);
  FUZZ_CHECK(!event.is_discarded(), "a stream chunk that is not JSON");
  return 0;
}
