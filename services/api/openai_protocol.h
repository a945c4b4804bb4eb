// The OpenAI wire format of the HTTP API (api_server.h): request bodies of /v1/chat/completions
// and /v1/completions turned into the scheduler's GenerateRequests, and the JSON of responses,
// stream chunks and errors. Pure functions over nlohmann::json; no I/O.
//
// A request body that is not JSON, not valid UTF-8, or has a field of the wrong type or range is
// an ApiError (400) naming the field; fields we do not know are ignored (as OpenAI's clients send
// new ones); OpenAI fields we know but do not implement (tools, response_format, logit_bias, ...)
// are refused naming the field, so that a client never gets an answer that silently ignored what
// it asked for. The one I/O is reading the image of a file:// URL, through local_media.h, when
// the context names a directory for them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/proto/client_messages.h"
#include "services/api/local_media.h"
#include "services/api/openai_logprobs.h"

namespace litellama::api {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" : null
  std::string code;   // "" : null
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

// What the server knows when it parses a request.
struct ParseContext {
  std::string served_model_name;
  int32_t max_n = 16;
  // Where file:// image URLs may point (--allowed-local-media-path); none: they are refused.
  std::optional<LocalMediaDir> local_media;
  // An image (decoded data: URL or file) larger than this gets 413 (--max-image-bytes).
  int64_t max_image_bytes = int64_t{20} << 20;
};

// One parsed request: `choices` GenerateRequests (one per prompt and per n), answered as one
// response whose choice i is the answer of generate[i].
struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
  int32_t n = 1;
  std::vector<proto::GenerateRequest> generate;
  // Chat image parts (data: or file:// URLs), their bytes in message order: every choice
  // carries them.
  std::vector<std::string> images;
  // Bytes of the image parts' URLs: the body less these is the request's text, which
  // --max-request-bytes bounds.
  int64_t n_image_url_bytes = 0;
  // completions with echo: the prompt text each choice's text starts with.
  std::vector<std::string> echo_prefix;
  // Index of the prompt each choice answers (usage counts each prompt once).
  std::vector<int32_t> prompt_index;
  // logprobs asked for (chat: logprobs true; completions: logprobs given). With echo the
  // completions answer lists the generated tokens only: prompt tokens have no logprobs here.
  bool logprobs = false;
};

// Parses a /v1/chat/completions (chat) or /v1/completions body. False with *error on bad input.
bool parse_request(const std::string& body, bool chat, const ParseContext& context,
                   ParsedRequest* out, ApiError* error);

// Maps a scheduler RequestError (code is a status_code_name) to the HTTP error a client sees;
// a prompt that does not fit the context becomes context_length_exceeded with both lengths.
ApiError map_scheduler_error(const std::string& code, const std::string& message, bool chat);

struct ChoiceResult {
  std::string text;
  std::string finish_reason;
  int32_t n_prompt_tokens = 0;
  int32_t n_generated_tokens = 0;
  int32_t n_cached_tokens = 0;         // prompt tokens the scheduler's prefix cache served
  std::vector<TokenLogprob> logprobs;  // with ParsedRequest::logprobs, one per generated token
};

// The usage object of a response over these choices (each prompt counted once).
nlohmann::ordered_json usage_json(const std::vector<ChoiceResult>& choices,
                                  const std::vector<int32_t>& prompt_index);

// A whole non-streaming response body.
std::string completion_body(const ParsedRequest& request, const std::string& id, int64_t created,
                            const std::vector<ChoiceResult>& choices);

// One `data: {...}\n\n` event of a stream. `delta_text` is the new text; `role` puts the
// assistant role in the delta (the first chunk of a chat choice); a non-empty finish_reason ends
// the choice (its delta is empty).
// With request.logprobs, `logprobs` are the tokens of delta_text and `text_offset` the offset of
// the first in the choice's text (completions).
std::string stream_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                         int32_t index, const std::string* delta_text, bool role,
                         const std::string& finish_reason,
                         const std::vector<TokenLogprob>* logprobs = nullptr,
                         size_t text_offset = 0);
// The closing chunk with empty choices and the usage (stream_options.include_usage).
std::string stream_usage_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                               const nlohmann::ordered_json& usage);
// `data: {"error": ...}\n\n`: an error after the stream has begun.
std::string stream_error(const ApiError& e);
inline constexpr const char* kStreamDone = "data: [DONE]\n\n";

// GET /v1/models.
std::string models_body(const std::string& served_model_name, int64_t created,
                        int64_t max_model_len);

}  // namespace litellama::api
