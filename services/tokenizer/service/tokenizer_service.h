// TokenizerService: one stateless tokenizer process. Connects a DEALER to the scheduler's
// tokenizer endpoint, announces itself with heartbeats, and answers EncodeRequest (text, or chat
// messages through the model's chat template; with an image token id, each of its occurrences
// expanded to the image's token count) and batched DetokenizeRequest. Any number of them may
// serve one scheduler.
//
// Two threads (net::WorkThreadService, as the vision service): the I/O thread (run()) owns the
// socket and sends heartbeats; the work thread encodes and detokenizes in arrival order. However
// long one prompt takes, heartbeats never wait on it, so the scheduler does not mistake a busy
// tokenizer for a dead one (and re-send the same prompt to the next).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/net/work_thread_service.h"
#include "common/proto/client_messages.h"
#include "common/proto/tokenizer_messages.h"
#include "common/status.h"

namespace litellama {

// scheduler_endpoint: the scheduler's tokenizer endpoint.
struct TokenizerOptions : net::PeerServiceOptions {
  std::string tokenizer_dir;  // directory with tokenizer.json (a model directory)
  // Text prompts (after the chat template) longer than this are refused, not encoded.
  int64_t max_prompt_bytes = proto::kDefaultMaxPromptBytes;
  // A chat template (Jinja source) used instead of the tokenizer's own; "" : the tokenizer's.
  std::string chat_template;
};

class TokenizerService {
 public:
  explicit TokenizerService(TokenizerOptions options);
  ~TokenizerService();

  // Loads the tokenizer, connects, starts the metrics listener.
  Status start();
  void run();
  void request_stop() { loop_->request_stop(); }
  std::atomic<bool>* stop_flag() { return loop_->stop_flag(); }

 private:
  struct Impl;
  proto::EncodeReply encode(const proto::EncodeRequest& request);
  proto::DetokenizeReply detokenize(const proto::DetokenizeRequest& request);
  // Serves one encode or detokenize message; "" when it was malformed (counted).
  std::string handle(std::string_view bytes);

  TokenizerOptions options_;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* encode_duration_ = nullptr;
  prometheus::Histogram* detokenize_duration_ = nullptr;
  prometheus::Histogram* request_latency_ = nullptr;
  prometheus::Counter* encode_requests_ = nullptr;
  prometheus::Counter* detokenize_items_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
  // Last: destroyed first, so the work thread stops before what it serves with goes.
  std::unique_ptr<net::WorkThreadService> loop_;
};

}  // namespace litellama
