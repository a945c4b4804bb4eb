// Client <-> scheduler hop: the client API on the scheduler's ROUTER socket (the CLI's DEALER
// speaks it). One frame per message. A client names its requests with ids unique per connection;
// the scheduler answers each GenerateRequest with GenerateChunk messages (text deltas and the new
// token ids, in order) ending in one with finished = true, or with one RequestError. An
// AbortRequest is answered by the final chunk (finish_reason "abort") when the request was known.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/proto/codec.h"
#include "common/proto/sampling_params.h"
#include "common/proto/sampling_params_codec.h"
#include "common/proto/step_ring.h"

namespace litellama::proto {

// One typed part of a message's content: "text" with its text, or "image" (its bytes travel as
// a frame of the request, in order).
struct ChatContentPart {
  std::string type;
  std::string text;
  MSGPACK_DEFINE_MAP(type, text);
};

// content: the text, with "<image>" where each image part stands (for chat templates that read a
// string); parts: the same as typed parts when the client sent them that way (for templates that
// read parts, such as llava-hf's), else empty. Absent parts read as empty.
struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ChatContentPart> parts;
  MSGPACK_DEFINE_MAP(role, content, parts);
};

inline constexpr int32_t kMaxTopLogits = kMaxStepTopLogits;
// Most top logprobs a request may ask for per generated token (OpenAI's chat limit).
inline constexpr int32_t kMaxTopLogprobs = 20;
static_assert(kMaxTopLogprobs <= kMaxStepTopLogits);
// Default bound on a text prompt (prompt text plus chat messages), well under the codec's 16 MB
// string limit: larger prompts are refused before anything tokenizes them.
inline constexpr int64_t kDefaultMaxPromptBytes = int64_t{4} << 20;

// GenerateRequest::max_tokens that asks for the rest of the context: the model's context (capped
// by the KV pool) less the prompt, resolved when the request is admitted.
inline constexpr int32_t kMaxTokensRestOfContext = -1;

// client -> scheduler. The input is prompt_ids when non-empty, else messages (the chat template is
// applied with a generation prompt) when non-empty, else the text prompt.
struct GenerateRequest {
  static constexpr MessageType kType = MessageType::kGenerateRequest;
  uint64_t request_id = 0;
  std::string prompt;
  std::vector<ChatMessage> messages;
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = true;       // text prompt only: prepend BOS etc. as the tokenizer says
  SamplingParams sampling;              // greedy by default
  int32_t max_tokens = 16;              // or kMaxTokensRestOfContext
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  std::vector<std::string> stop;        // stop strings; the text ends before the first match
  bool ignore_eos = false;              // do not stop on the model's EOS ids
  bool skip_special_tokens = true;      // leave special tokens out of the text
  // Return this many largest raw logits of the first generated position (0: none; at most
  // kMaxTopLogits, larger is refused).
  int32_t top_logits = 0;
  // Scheduling priority: larger is admitted (and kept when slots run out) first; first come first
  // served within a priority. Older clients leave it out (0).
  int32_t priority = 0;
  // Return the logprob of every generated token, and with top_logprobs (0..kMaxTopLogprobs; only
  // with logprobs) that many most likely ids of each position. Logprobs are of the model's raw
  // distribution: the log-softmax of the logits before penalties and temperature.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // Images (LLaVA): the message is followed by this many ZeroMQ frames, each one image's bytes
  // (JPEG or PNG), in the order of the prompt's images. Each image is one image token in the
  // prompt (expanded to the image's token count: by the tokenizer for a text or chat prompt, by
  // the scheduler for prompt_ids) or a run of exactly that count.
  int32_t n_images = 0;
  MSGPACK_DEFINE_MAP(request_id, prompt, messages, prompt_ids, add_special_tokens, sampling,
                     max_tokens, stop_token_ids, stop, ignore_eos, skip_special_tokens, top_logits,
                     priority, logprobs, top_logprobs, n_images);
};

// scheduler -> client: the next piece of one request's output.
struct GenerateChunk {
  static constexpr MessageType kType = MessageType::kGenerateChunk;
  uint64_t request_id = 0;
  std::string text;                // UTF-8 text delta (never splits a character)
  std::vector<int32_t> token_ids;  // ids generated since the previous chunk
  bool finished = false;
  std::string finish_reason;  // when finished: "stop", "length" or "abort"
  int32_t n_prompt_tokens = 0;
  int32_t n_generated_tokens = 0;  // so far
  // Only on the chunk that carries the first generated token, when the request asked for them:
  // (id, raw logit) of the first generated position, largest first.
  std::vector<std::pair<int32_t, float>> top_logits;
  // Prompt tokens whose KV came from the prefix cache (usage.prompt_tokens_details.cached_tokens);
  // set once the request was admitted.
  int32_t n_cached_tokens = 0;
  // When the request asked for logprobs, aligned with token_ids: each id's logprob, and the
  // (id, logprob) of its position's top_logprobs most likely ids, most likely first.
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // With logprobs, aligned with token_ids: the bytes of the id alone (decoded by itself; may be
  // incomplete UTF-8), then those of each of its top_logprobs ids. Empty where unknown (ids
  // after a stop string, or an aborted request's last ones).
  std::vector<std::vector<std::string>> pieces;
  MSGPACK_DEFINE_MAP(request_id, text, token_ids, finished, finish_reason, n_prompt_tokens,
                     n_generated_tokens, top_logits, n_cached_tokens, logprobs, top_logprobs,
                     pieces);
};

// client -> scheduler: stop a request and free its KV slots now.
struct AbortRequest {
  static constexpr MessageType kType = MessageType::kAbortRequest;
  uint64_t request_id = 0;
  MSGPACK_DEFINE_MAP(request_id);
};

// scheduler -> client: the request failed (or the message with this id was not understood); no
// further message about it follows. `code` is a status_code_name; `message` is fixed text.
// "overloaded" means the waiting queue was full (--max-waiting-requests): the request was refused
// at once, nothing ran, and sending it again later may succeed.
// request_id names the request this error ends. A generate_request refused because its id is
// still in use gets request_id 0 (the live request with that id goes on) and the id in
// duplicate_request_id.
struct RequestError {
  static constexpr MessageType kType = MessageType::kRequestError;
  uint64_t request_id = 0;
  std::string code;
  std::string message;
  uint64_t duplicate_request_id = 0;
  MSGPACK_DEFINE_MAP(request_id, code, message, duplicate_request_id);
};

// client -> scheduler: what is being served and whether it is ready.
struct ServerInfoRequest {
  static constexpr MessageType kType = MessageType::kServerInfoRequest;
  uint64_t request_id = 0;
  MSGPACK_DEFINE_MAP(request_id);
};

struct ServerInfoReply {
  static constexpr MessageType kType = MessageType::kServerInfoReply;
  uint64_t request_id = 0;
  bool ready = false;  // a worker and at least one tokenizer are up
  bool worker_up = false;
  int32_t n_tokenizers = 0;
  std::string model;  // the worker's model name
  std::string device;
  std::string dtype;  // the worker's compute dtype, torch name
  int32_t n_kv_slots = 0;
  int32_t n_kv_slots_used = 0;
  int32_t n_requests_running = 0;
  int32_t n_requests_waiting = 0;
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;
  // A vision service is up: requests may carry images (image_token_id marks their place).
  bool vision_up = false;
  int32_t image_token_id = -1;
  int32_t image_tokens = 0;  // tokens one image takes in the prompt
  MSGPACK_DEFINE_MAP(request_id, ready, worker_up, n_tokenizers, model, device, dtype, n_kv_slots,
                     n_kv_slots_used, n_requests_running, n_requests_waiting, max_model_len,
                     vocab_size, eos_token_ids, vision_up, image_token_id, image_tokens);
};

}  // namespace litellama::proto
