// SchedulerService: the scheduler process. Binds three ROUTER sockets (clients, the worker,
// tokenizers), keeps peers' liveness by heartbeats, turns client requests into prompt ids through
// a tokenizer, runs the ContinuousBatcher against the worker through the shared-memory step ring
// (keeping up to two steps queued so the worker never waits for planning), and streams text
// deltas back through the tokenizers' stateless incremental detokenization.
//
// Every accepted request gets exactly one end: a final GenerateChunk or a RequestError. A peer
// that dies fails only the requests that depended on its state (running requests when the worker
// goes; nothing is lost when a tokenizer goes, its work is re-sent to another or waits).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/net/metrics_server.h"
#include "common/net/run_dir.h"
#include "common/proto/client_messages.h"
#include "common/proto/step_ring.h"
#include "common/proto/tokenizer_messages.h"
#include "common/proto/vision_messages.h"
#include "common/proto/worker_messages.h"
#include "common/status.h"
#include "services/scheduler/continuous_batcher.h"
#include "services/scheduler/image_table.h"
#include "services/scheduler/kv_slot_allocator.h"
#include "services/scheduler/request.h"
#include "services/scheduler/scheduler_metrics.h"

namespace litellama {

struct SchedulerOptions {
  std::string client_endpoint;
  std::string worker_endpoint;
  std::string tokenizer_endpoint;
  std::string vision_endpoint;  // "" : no vision service (requests with images are refused)
  std::string metrics_listen;   // "" : no HTTP listener
  int32_t heartbeat_interval_ms = 200;
  int32_t peer_timeout_ms = 2000;
  bool allow_insecure_tcp = false;  // tcp:// endpoints off loopback (--insecure-tcp)
  // How long a request may wait for a missing peer (worker for admission, tokenizer for
  // encoding or text) before it fails.
  int32_t peer_wait_ms = 30000;
  BatcherOptions batcher;
  int32_t max_tokens_limit = 1 << 20;  // largest max_tokens a request may ask for
  // Largest text prompt (prompt + every chat message's role and content), in bytes.
  int64_t max_prompt_bytes = proto::kDefaultMaxPromptBytes;
  // An encode not answered this long fails its request (the tokenizer may be stuck on it).
  int32_t encode_timeout_ms = 30000;
  // A request whose tokenizer work was lost this many times (the tokenizer died or went silent
  // holding it) fails instead of being re-sent again.
  int32_t max_tokenizer_retries = 2;
  // Requests waiting for admission (tokenizing or queued) beyond which new ones are refused at
  // once with "overloaded"; 0: unbounded.
  int32_t max_waiting_requests = 0;
  // Longest prompt + completion a request may have (--max-model-len); 0: the model's own.
  int64_t max_model_len = 0;
  // Largest image a request may carry, in bytes (--max-image-bytes).
  int64_t max_image_bytes = int64_t{20} << 20;
  // Most images one request may carry.
  int32_t max_images_per_request = 16;
};

class SchedulerService {
 public:
  explicit SchedulerService(SchedulerOptions options);
  ~SchedulerService();

  // Binds the sockets and starts the metrics listener.
  Status start();
  // Serves until request_stop(); returns after answering what can be answered.
  void run();
  void request_stop() { stop_.store(true); }
  std::atomic<bool>* stop_flag() { return &stop_; }

  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // The metrics registry (thread-safe to collect), also served by the HTTP API.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  struct WorkerPeer {
    std::string identity;
    proto::WorkerHeartbeat info;
    std::unique_ptr<proto::StepRing> ring;
    double last_seen = 0.0;
  };
  struct TokenizerPeer {
    std::string identity;
    uint64_t incarnation = 0;
    double last_seen = 0.0;
  };
  struct TokenizerOp {
    bool encode = false;
    std::string tokenizer;  // identity it was sent to
    double t_sent = 0.0;
    std::vector<uint64_t> request_ids;
    std::vector<int32_t> window_end;  // detokenize: ids covered by each item
    std::vector<uint8_t> final;
  };
  struct VisionPeer {
    std::string identity;
    proto::VisionHeartbeat info;
    double last_seen = 0.0;
  };
  struct VisionOp {
    uint64_t image_hash = 0;
    double t_sent = 0.0;
  };
  struct InFlightStep {
    PlannedStep plan;
    int32_t buffer = 0;
    double t_sent = 0.0;
  };

  // Sockets.
  void on_client_frames(std::vector<zmq::message_t>& frames);
  void on_worker_frames(std::vector<zmq::message_t>& frames);
  void on_tokenizer_frames(std::vector<zmq::message_t>& frames);
  void protocol_error(const char* socket, const Status& why);

  // Clients.
  void on_generate(const std::string& client, const proto::GenerateRequest& msg,
                   std::vector<std::string> images = {});
  void on_abort(const std::string& client, const proto::AbortRequest& msg);
  void on_server_info(const std::string& client, const proto::ServerInfoRequest& msg);
  void send_error(const std::string& client, uint64_t client_request_id, StatusCode code,
                  const std::string& message, uint64_t duplicate_request_id = 0);
  // Sends what is new for r; erases r once its last chunk went out.
  void flush(Request* r);
  void fail(Request* r, StatusCode code, const std::string& message);
  void abort(Request* r, bool client_gone);
  void erase(Request* r);

  // Worker.
  void on_worker_heartbeat(const std::string& identity, const proto::WorkerHeartbeat& hb);
  void on_step_result(const proto::StepResult& result);
  // disconnected: the connection is gone (the process died), not merely silent.
  void worker_lost(const char* why, bool disconnected);
  void schedule_steps();

  // Tokenizers.
  void on_tokenizer_heartbeat(const std::string& identity, const proto::TokenizerHeartbeat& hb);
  void on_encode_reply(const proto::EncodeReply& reply);
  void on_detokenize_reply(const proto::DetokenizeReply& reply);
  void tokenizer_lost(const std::string& identity, const char* why);
  const TokenizerPeer* pick_tokenizer();
  void dispatch_encodes();
  void dispatch_detokenize();
  void apply_stop_strings(Request* r, size_t search_from);

  // Vision (scheduler_vision.cpp). A request's ids are known: its images are placed in the
  // prompt and encoded (or found encoded) before it joins the admission queue.
  void start_generation(Request* r);
  void on_vision_frames(std::vector<zmq::message_t>& frames);
  void on_vision_heartbeat(const std::string& identity, const proto::VisionHeartbeat& hb);
  void on_encode_image_reply(const proto::EncodeImageReply& reply);
  // The vision process is gone or replaced: requests that still need its rows fail. gone: it is
  // certainly not running (its connection broke, or a new process replaced it), so its
  // shared-memory pool may be removed; a silent one may still be mapping it.
  void vision_lost(const char* why, bool gone);
  // Finds each image's place in r's prompt (expanding single image tokens); false: r failed.
  bool place_images(Request* r);
  // Acquires slots and sends encodes for r's images; enqueues r once all are ready.
  void advance_images(Request* r);
  void release_images(Request* r);

  void on_tick();
  // Declares a worker, tokenizer or vision service lost after peer_timeout_ms without a message;
  // called right after their sockets are drained.
  void check_peers_alive();
  void update_gauges();
  std::string ready_reason() const;
  // The context the batcher enforces: the model's, capped by options_.max_model_len.
  int64_t max_model_len(const proto::WorkerHeartbeat& hb) const;

  SchedulerOptions options_;
  std::atomic<bool> stop_{false};
  uint64_t incarnation_ = 0;
  std::vector<std::unique_ptr<net::ListenerLock>> listener_locks_;  // one per ipc:// endpoint
  zmq::context_t context_{1};
  zmq::socket_t clients_;
  zmq::socket_t workers_;
  zmq::socket_t tokenizers_;
  zmq::socket_t vision_;

  std::shared_ptr<prometheus::Registry> registry_;
  SchedulerMetrics metrics_data_;
  std::unique_ptr<net::MetricsServer> metrics_;

  KvSlotAllocator allocator_;
  ContinuousBatcher batcher_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::map<std::pair<std::string, uint64_t>, uint64_t> by_client_;
  uint64_t next_request_id_ = 1;

  std::unique_ptr<WorkerPeer> worker_;
  std::atomic<bool> worker_up_{false};
  std::atomic<bool> worker_loading_{false};
  std::deque<InFlightStep> in_flight_;
  std::set<uint64_t> dead_workers_;  // incarnations whose connection was lost
  // Other workers that announced themselves while worker_ was up (a unit started twice, a second
  // serve on this run dir): kept out of service, by identity, with when they were last heard.
  std::map<std::string, double> standby_workers_;
  uint64_t next_step_id_ = 1;
  int32_t next_buffer_ = 0;

  std::map<std::string, TokenizerPeer> tokenizer_peers_;
  std::atomic<int32_t> n_tokenizers_up_{0};
  size_t next_tokenizer_ = 0;
  std::unordered_map<uint64_t, TokenizerOp> tokenizer_ops_;
  uint64_t next_op_id_ = 1;
  std::deque<uint64_t> encode_queue_;
  std::unordered_map<uint64_t, proto::EncodeRequest>
      pending_encodes_;  // by request id  // requests waiting for a tokenizer to encode them
  std::vector<int32_t> tokenizer_eos_ids_;

  std::unique_ptr<VisionPeer> vision_peer_;
  ImageTable image_table_;
  std::unordered_map<uint64_t, VisionOp> vision_ops_;  // encodes sent, by op id
  uint64_t next_vision_op_ = 1;
  // Requests in kImages, in arrival order: they wait for slots or for encodes to finish.
  std::deque<uint64_t> image_waiters_;

  double last_heartbeat_sent_ = 0.0;
};

}  // namespace litellama
