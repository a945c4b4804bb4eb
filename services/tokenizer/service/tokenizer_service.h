// TokenizerService: one stateless tokenizer process. Connects a DEALER to the scheduler's
// tokenizer endpoint, announces itself with heartbeats, and answers EncodeRequest (text, or chat
// messages through the model's chat template; with an image token id, each of its occurrences
// expanded to the image's token count) and batched DetokenizeRequest. Any number of them may
// serve one scheduler.
//
// Two threads, as in the worker: the I/O thread (run()) owns the socket and sends heartbeats; the
// work thread encodes and detokenizes, fed over an inproc pair in arrival order. However long one
// prompt takes, heartbeats never wait on it, so the scheduler does not mistake a busy tokenizer
// for a dead one (and re-send the same prompt to the next).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/net/metrics_server.h"
#include "common/proto/client_messages.h"
#include "common/proto/tokenizer_messages.h"
#include "common/status.h"

namespace litellama {

struct TokenizerOptions {
  std::string scheduler_endpoint;  // the scheduler's tokenizer endpoint
  std::string tokenizer_dir;       // directory with tokenizer.json (a model directory)
  std::string metrics_listen;      // "" : no HTTP listener
  int32_t heartbeat_interval_ms = 200;
  int32_t peer_timeout_ms = 2000;
  bool allow_insecure_tcp = false;  // tcp:// endpoints off loopback (--insecure-tcp)
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
  void request_stop() { stop_.store(true); }
  std::atomic<bool>* stop_flag() { return &stop_; }

 private:
  struct Impl;
  proto::EncodeReply encode(const proto::EncodeRequest& request);
  proto::DetokenizeReply detokenize(const proto::DetokenizeRequest& request);
  void work_main();
  // Serves one encode or detokenize message; "" when it was malformed (counted).
  std::string handle(const std::string& bytes);
  std::string ready_reason() const;

  TokenizerOptions options_;
  std::unique_ptr<Impl> impl_;
  uint64_t incarnation_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> loaded_{false};
  std::atomic<double> last_scheduler_seen_{0.0};
  zmq::context_t context_{1};
  zmq::socket_t scheduler_;
  zmq::socket_t work_io_;  // I/O thread's end of the inproc pair to the work thread
  std::thread work_thread_;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<net::MetricsServer> metrics_;
  prometheus::Histogram* encode_duration_ = nullptr;
  prometheus::Histogram* detokenize_duration_ = nullptr;
  prometheus::Histogram* request_latency_ = nullptr;
  prometheus::Counter* encode_requests_ = nullptr;
  prometheus::Counter* detokenize_items_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
};

}  // namespace litellama
