// Scheduler <-> tokenizer hop. Tokenizers are stateless: each connects a DEALER to the scheduler's
// tokenizer ROUTER, announces itself with TokenizerHeartbeat (and keeps doing so), and answers
// EncodeRequest and DetokenizeRequest from whoever asks. Incremental detokenization carries its
// state in the request (a window of ids and a read offset, as in vLLM), so any replica can serve
// any request and a restart loses nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/proto/client_messages.h"
#include "common/proto/codec.h"

namespace litellama::proto {

// tokenizer -> scheduler, every heartbeat interval and at start.
struct TokenizerHeartbeat {
  static constexpr MessageType kType = MessageType::kTokenizerHeartbeat;
  uint64_t incarnation = 0;  // random per process start: a restart is a new tokenizer
  std::vector<int32_t> eos_token_ids;
  MSGPACK_DEFINE_MAP(incarnation, eos_token_ids);
};

// Most ids an encode may produce by expanding image tokens (the codec's array limit): a prompt
// whose expansion would pass it is refused rather than answered with a reply nobody can decode.
inline constexpr int64_t kMaxExpandedPromptTokens = int64_t{1} << 22;
// Largest image_token_count an EncodeRequest may ask for.
inline constexpr int32_t kMaxTokensPerImage = 1 << 16;

// scheduler -> tokenizer: text or chat messages to ids.
struct EncodeRequest {
  static constexpr MessageType kType = MessageType::kEncodeRequest;
  uint64_t op_id = 0;  // the scheduler's tokenizer operation, echoed by the reply
  std::string text;
  std::vector<ChatMessage> messages;  // when non-empty: apply the chat template, then encode
  bool add_special_tokens = true;     // text only
  int64_t sent_unix_ns = 0;
  // Images (LLaVA): every image_token_id the encoded prompt holds becomes image_token_count
  // copies of it (the image's rows in the vision pool). image_token_id < 0 (the default, and
  // what an older scheduler leaves out): no expansion.
  int32_t image_token_id = -1;
  int32_t image_token_count = 0;
  MSGPACK_DEFINE_MAP(op_id, text, messages, add_special_tokens, sent_unix_ns, image_token_id,
                     image_token_count);
};

struct EncodeReply {
  static constexpr MessageType kType = MessageType::kEncodeReply;
  uint64_t op_id = 0;
  std::vector<int32_t> token_ids;
  std::string error;  // empty on success
  MSGPACK_DEFINE_MAP(op_id, token_ids, error);
};

// One request's detokenization window: text of ids[read_offset:] given ids[:read_offset] as
// context (the context makes leading-space and multi-byte handling right).
struct DetokenizeItem {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  int32_t read_offset = 0;
  bool skip_special_tokens = true;
  bool final = false;  // flush: emit the text even when it ends inside a UTF-8 character
  // Ids whose bytes alone (Tokenizer::token_bytes) the result returns in `pieces` (logprobs).
  std::vector<int32_t> piece_ids;
  MSGPACK_DEFINE_MAP(request_id, token_ids, read_offset, skip_special_tokens, final, piece_ids);
};

// scheduler -> tokenizer: one step's worth of windows.
struct DetokenizeRequest {
  static constexpr MessageType kType = MessageType::kDetokenizeRequest;
  uint64_t op_id = 0;  // the scheduler's tokenizer operation, echoed by the reply
  std::vector<DetokenizeItem> items;
  int64_t sent_unix_ns = 0;
  MSGPACK_DEFINE_MAP(op_id, items, sent_unix_ns);
};

struct DetokenizeResult {
  uint64_t request_id = 0;
  std::string text;                 // new text of ids[read_offset:]
  bool advanced = false;            // false: the window ends inside a character; nothing consumed
  std::vector<std::string> pieces;  // bytes of each of the item's piece_ids, in order
  MSGPACK_DEFINE_MAP(request_id, text, advanced, pieces);
};

struct DetokenizeReply {
  static constexpr MessageType kType = MessageType::kDetokenizeReply;
  uint64_t op_id = 0;
  std::vector<DetokenizeResult> items;  // same order as the request
  std::string error;                    // empty on success
  MSGPACK_DEFINE_MAP(op_id, items, error);
};

}  // namespace litellama::proto
