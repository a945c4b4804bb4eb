// WorkerService: the worker process around a ModelRunner. Two threads: the compute thread loads
// the model, creates the shared-memory StepRing and runs steps in order; the I/O thread owns the
// DEALER socket to the scheduler, sends heartbeats (also while loading and while a long step
// runs) and passes doorbells to the compute thread over an inproc pair, so a step result goes out
// the moment it is ready.
//
// Placeholders: a token id < 0 in a step names the id sampled for sequence (-id - 1) by the step
// run just before it (see proto::StepRequest); the compute thread resolves them from its last
// output, which is what lets the scheduler queue step N+1 while step N runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/net/metrics_server.h"
#include "common/proto/step_ring.h"
#include "common/proto/worker_messages.h"
#include "common/status.h"
#include "services/worker/model_runner.h"
#include "services/worker/ring_step.h"

namespace litellama {

struct WorkerOptions {
  std::string scheduler_endpoint;  // the scheduler's worker endpoint
  std::string model_dir;
  RunnerOptions runner;
  // Compute dtype: auto or a torch name (resolve_compute_dtype, against the checkpoint's dtype
  // once it is opened); it replaces runner.compute_dtype.
  std::string dtype = "auto";
  std::string step_ring_name;  // "" : litellama-step-<pid>-<random>
  std::string metrics_listen;  // "" : no HTTP listener
  int32_t heartbeat_interval_ms = 200;
  int32_t peer_timeout_ms = 2000;
  bool allow_insecure_tcp = false;  // tcp:// endpoints off loopback (--insecure-tcp)
};

class WorkerService {
 public:
  // net::run_service leaves READY=1 to the service: it is sent once the model is loaded.
  static constexpr bool kNotifiesReadyItself = true;

  explicit WorkerService(WorkerOptions options);
  ~WorkerService();

  // Connects, starts the metrics listener and starts loading the model in the background.
  Status start();
  // Serves until request_stop() or a fatal error (model failed to load); returns that error.
  Status run();
  void request_stop() { stop_.store(true); }
  std::atomic<bool>* stop_flag() { return &stop_; }

 private:
  void compute_main();
  Status load();
  std::string run_step(const std::string& doorbell_bytes);
  // Copies each sampled sequence's top logits into the ring's top_ids/top_values.
  static void write_top_logits(const StepOutput& output, int32_t n_top_logits,
                               const proto::StepView& view);
  proto::WorkerHeartbeat heartbeat() const;
  std::string ready_reason() const;

  WorkerOptions options_;
  uint64_t incarnation_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> standby_{false};  // the scheduler keeps this worker out of service
  std::atomic<double> last_scheduler_seen_{0.0};
  Status load_status_;
  mutable std::mutex info_mutex_;
  proto::WorkerHeartbeat info_;  // filled once loaded

  zmq::context_t context_{1};
  zmq::socket_t scheduler_;
  zmq::socket_t compute_io_;  // I/O thread's end of the inproc pair
  std::thread compute_thread_;

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<proto::StepRing> ring_;
  bool ring_registered_ = false;  // page-locked through the runner
  RingStepReader reader_;
  std::vector<int32_t> previous_sampled_;
  StepBatchView batch_;
  StepOutput output_;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<net::MetricsServer> metrics_;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* step_device_duration_ = nullptr;  // GPU backends only
  prometheus::Histogram* image_handoff_ = nullptr;
  prometheus::Histogram* doorbell_latency_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* step_errors_ = nullptr;
  prometheus::Counter* step_tokens_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
  prometheus::Counter* graph_replays_ = nullptr;  // cuda with graphs only (and captures_)
  prometheus::Counter* graph_captures_ = nullptr;
  int64_t graph_replays_seen_ = 0;  // likewise
  int64_t graph_captures_seen_ = 0;
  prometheus::Counter* cascade_steps_ = nullptr;  // cuda only
  int64_t cascade_steps_seen_ = 0;
  prometheus::Gauge* kv_slots_capacity_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_info_ = nullptr;
  prometheus::Family<prometheus::Gauge>* weight_bytes_ = nullptr;
  prometheus::Gauge* scheduler_up_ = nullptr;
};

}  // namespace litellama
