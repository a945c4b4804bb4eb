// SchedulerClient: the client side of the client <-> scheduler hop (client_messages.h) over one
// DEALER socket. Not thread-safe; one client may have many requests outstanding (the bench
// command does), told apart by the ids submit() assigns.
//
// When the connection to the scheduler drops (the scheduler died or restarted: a new one knows
// nothing of the old one's requests), every request still open gets an error event at once
// instead of waiting out the caller's timeout. The socket reconnects by itself; new requests go
// to the new scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "common/proto/client_messages.h"
#include "common/status.h"

namespace litellama::net {

struct ClientEvent {
  enum class Kind { kChunk, kError };
  Kind kind = Kind::kChunk;
  proto::GenerateChunk chunk;  // kChunk
  proto::RequestError error;   // kError
  uint64_t request_id() const { return kind == Kind::kChunk ? chunk.request_id : error.request_id; }
};

// A whole answer, with client-side timings (seconds since submit).
struct Completion {
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;
  int32_t n_prompt_tokens = 0;
  int32_t n_cached_tokens = 0;  // prompt tokens served from the scheduler's prefix cache
  // (id, raw logit) of the first generated position, largest first; empty unless requested.
  std::vector<std::pair<int32_t, float>> top_logits;
  double first_token_seconds = 0.0;
  double total_seconds = 0.0;
  std::vector<double> token_times_seconds;  // arrival of each chunk that carried tokens
};

class SchedulerClient {
 public:
  using ChunkCallback = std::function<void(const proto::GenerateChunk&)>;

  static Result<std::unique_ptr<SchedulerClient>> connect(const std::string& endpoint);
  ~SchedulerClient();

  // Sends `request` under a fresh id (its request_id is overwritten) and returns that id.
  // Waits until the connection to the server is up; fails after timeout_ms naming the address
  // and how to start a server (ZeroMQ connects lazily, so without this a client with nothing to
  // talk to would only learn it from its request's timeout).
  Status wait_connected(int timeout_ms);

  // images: one entry per image of the prompt (JPEG/PNG bytes), sent as frames after the
  // request; request.n_images is set to their count.
  Result<uint64_t> submit(proto::GenerateRequest request,
                          const std::vector<std::string>& images = {});
  Status abort(uint64_t request_id);
  // The next chunk or error of any request, or nullopt after timeout_ms without one.
  Result<std::optional<ClientEvent>> next_event(int timeout_ms);

  Result<proto::ServerInfoReply> server_info(int timeout_ms);
  // Asks until the scheduler says it is ready (worker and a tokenizer up) or timeout_ms passed.
  Status wait_ready(int timeout_ms);

  // Runs one request to its end, calling on_chunk for every chunk. Fails with the scheduler's
  // error, or kUnavailable when nothing arrived for idle_timeout_ms.
  Result<Completion> generate(proto::GenerateRequest request, const ChunkCallback& on_chunk,
                              int idle_timeout_ms = 60000,
                              const std::vector<std::string>& images = {});

  // A file descriptor (an eventfd) that, when readable, makes next_event() return early with
  // nothing, so that a thread waiting for events can also be woken for other work. The caller
  // drains it. -1: none.
  void set_wake_fd(int fd) { wake_fd_ = fd; }

  // Frames from the scheduler that could not be decoded (counted and dropped).
  int64_t n_protocol_errors() const { return n_protocol_errors_; }

 private:
  SchedulerClient() = default;
  // Receives one frame and decodes it; sets *info for a ServerInfoReply.
  Result<bool> receive(int timeout_ms, std::optional<proto::ServerInfoReply>* info);

  // Fails every open request (the scheduler that knew them is gone).
  void connection_lost();
  void on_monitor_event(const std::vector<zmq::message_t>& frames);

  zmq::context_t context_{1};
  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // ZMQ_EVENT_CONNECTED / DISCONNECTED of socket_
  std::string endpoint_;
  bool connected_ = false;
  std::set<uint64_t> open_;  // submitted, no final chunk or error yet
  uint64_t next_request_id_ = 1;
  std::deque<ClientEvent> events_;
  int64_t n_protocol_errors_ = 0;
  int wake_fd_ = -1;
  bool woken_ = false;
};

}  // namespace litellama::net
