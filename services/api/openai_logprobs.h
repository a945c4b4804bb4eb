// Logprobs in the OpenAI wire format: the request fields (chat: logprobs + top_logprobs;
// completions: logprobs as a count) and the answers (chat's choices[i].logprobs.content[], the
// legacy completions object {tokens, token_logprobs, top_logprobs, text_offset}). Logprobs are of
// the model's raw distribution, as the scheduler returns them per generated token.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/proto/client_messages.h"

namespace litellama::api {

struct ApiError;

// One generated token: its bytes (the id decoded alone), logprob, and most likely alternatives.
struct TokenLogprob {
  std::string bytes;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // (bytes, logprob), most likely first
};

// Reads the logprobs fields of a request body into `out` (logprobs, top_logprobs). Chat:
// `logprobs` a boolean, `top_logprobs` 0..20 and only with logprobs true. Completions: `logprobs`
// an integer 0..20 (the number of alternatives; OpenAI allows 5). False with *error otherwise.
bool read_logprobs(const nlohmann::json& body, bool chat, proto::GenerateRequest* out,
                   ApiError* error);

// The tokens of a chunk with their logprobs (the chunk's ids, pieces and logprobs aligned).
std::vector<TokenLogprob> chunk_logprobs(const proto::GenerateChunk& chunk);

// A token's text as OpenAI shows it: its bytes when they are valid UTF-8, else "bytes:\xNN..."
// spelling every byte.
std::string token_text(const std::string& bytes);

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
nlohmann::ordered_json chat_logprobs_json(const std::vector<TokenLogprob>& tokens);
// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; offsets count bytes of
// the choice's text from `text_offset` (the first token's).
nlohmann::ordered_json completion_logprobs_json(const std::vector<TokenLogprob>& tokens,
                                                size_t text_offset);

}  // namespace litellama::api
