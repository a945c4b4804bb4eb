// WorkThreadService: the shape the tokenizer and vision services share. A DEALER to the
// scheduler is owned by the I/O thread (run()), which sends heartbeats and hands each work
// message over an inproc pair to a work thread; the work thread serves messages in arrival order
// and hands the replies back for the I/O thread to send. So a long piece of work (a 4 MB prompt,
// an image encode) never delays a heartbeat, and the scheduler never takes a busy service for a
// dead one.
//
// The service supplies what differs: its name (the routing id "<name>-<incarnation>", the inproc
// endpoint and log lines), which message types are work and how many frames one may have (an
// encode request and its image's bytes are two), and serve(), which turns a work message's
// frames into the reply's bytes on the work thread. Everything else (heartbeats, the
// scheduler's liveness for /ready, malformed and unexpected messages counted and dropped, the
// orderly stop) is here.
//
// What must stay true: the socket to the scheduler is touched only by the thread in run() (and
// by connect() before it); serve() runs only on the work thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/net/metrics_server.h"
#include "common/proto/codec.h"
#include "common/status.h"

namespace litellama::net {

// The connection fields of a service's options (add_common_service_flags binds them).
struct PeerServiceOptions {
  std::string scheduler_endpoint;
  std::string metrics_listen;  // "" : no HTTP listener
  int32_t heartbeat_interval_ms = 200;
  int32_t peer_timeout_ms = 2000;
  bool allow_insecure_tcp = false;  // tcp:// endpoints off loopback (--insecure-tcp)
};

struct WorkThreadServiceConfig {
  std::string name;  // "tokenizer", "vision"
  PeerServiceOptions peer;
  // Messages handed to the work thread; every other type but the scheduler's heartbeat is a
  // protocol error.
  std::vector<proto::MessageType> work_types;
  size_t max_work_frames = 1;  // a work message of more frames is a protocol error
  std::string loading_what;    // /ready's reason until mark_loaded(), e.g. "loading the tokenizer"
};

class WorkThreadService {
 public:
  // serve: a work message's frames (the msgpack message first) to the reply's bytes, or "" for
  // none (a malformed message: serve counts it).
  using Serve = std::function<std::string(std::vector<zmq::message_t>& frames)>;

  WorkThreadService(WorkThreadServiceConfig config, std::shared_ptr<prometheus::Registry> registry,
                    prometheus::Counter* protocol_errors);
  ~WorkThreadService();
  WorkThreadService(const WorkThreadService&) = delete;
  WorkThreadService& operator=(const WorkThreadService&) = delete;

  // Checks the liveness flags and the endpoint and starts the metrics listener (/ready says
  // loading_what until mark_loaded()). First, before the service loads anything.
  Status prepare();
  void mark_loaded() { loaded_.store(true); }
  // Connects to the scheduler and starts the work thread serving with `serve`. After loading.
  // `after_reply`, when set, runs on the work thread after each reply is handed to the I/O
  // thread (the vision service waits for its device there, the reply already on its way).
  Status connect(Serve serve, std::function<void()> after_reply = {});
  // The I/O loop: heartbeats of `heartbeat` bytes every interval, work to the work thread,
  // replies to the scheduler, until request_stop(); then stops the work thread.
  void run(const std::string& heartbeat);
  void request_stop() { stop_.store(true); }
  std::atomic<bool>* stop_flag() { return &stop_; }

  uint64_t incarnation() const { return incarnation_; }
  // The metrics listener's port, or "(off)".
  std::string metrics_port() const;

 private:
  std::string ready_reason() const;
  void work_main(const Serve& serve, const std::function<void()>& after_reply);
  // Stops and joins the work thread (idempotent).
  void stop_work();

  WorkThreadServiceConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* protocol_errors_ = nullptr;
  std::string work_endpoint_;
  uint64_t incarnation_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> loaded_{false};
  std::atomic<double> last_scheduler_seen_{0.0};
  zmq::context_t context_{1};
  zmq::socket_t scheduler_;
  zmq::socket_t work_io_;  // the I/O thread's end of the inproc pair to the work thread
  std::thread work_thread_;
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace litellama::net
