// VisionService: the litellama-vision process. Connects a DEALER to the scheduler's vision
// endpoint, announces itself and its embedding pool with heartbeats, and encodes the images the
// scheduler sends (EncodeImageRequest + the image's bytes as a second frame) into the pool slot
// the request names: decode (JPEG/PNG), the checkpoint's CLIP preprocessing, the vision tower and
// the projector, rows written in place into the pool the worker reads (vision_messages.h).
//
// Two threads, as in the tokenizer: the I/O thread (run()) owns the socket and sends heartbeats;
// the work thread encodes, fed over an inproc pair in arrival order, so a long encode never makes
// the service look dead. The pool is created at start and removed when the service stops; a
// restarted service is a new incarnation with a new, empty pool, which the scheduler learns from
// its heartbeat.
//
// Backend: the CPU encoder (services/vision/llava_vision_encoder.h) with a shared-memory pool.
// The CUDA tower and a device pool exported through CUDA IPC are not built yet: --device cuda is
// refused at start with that reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/net/metrics_server.h"
#include "common/proto/vision_messages.h"
#include "common/status.h"

namespace litellama {

inline constexpr int64_t kDefaultMaxImageBytes = int64_t{20} << 20;
inline constexpr int64_t kDefaultVisionPoolBytes = int64_t{256} << 20;

struct VisionOptions {
  std::string scheduler_endpoint;  // the scheduler's vision endpoint
  std::string model_dir;           // a LLaVA checkpoint
  std::string device = "cpu";
  std::string metrics_listen;  // "" : no HTTP listener
  int32_t heartbeat_interval_ms = 200;
  int32_t peer_timeout_ms = 2000;
  bool allow_insecure_tcp = false;
  int64_t max_image_bytes = kDefaultMaxImageBytes;
  // The pool's size in bytes: as many whole image slots as fit (at least one).
  int64_t pool_bytes = kDefaultVisionPoolBytes;
  // The shared-memory name of the pool; "" : one derived from the process's incarnation.
  std::string pool_name;
  // Pad each image to a square of the mean colour first (the original LLaVA's expand2square)
  // instead of the processor's resize and center crop of the whole image.
  bool pad_to_square = false;
  int32_t n_threads = 0;  // encoder threads (0: all hardware threads)
};

class VisionService {
 public:
  explicit VisionService(VisionOptions options);
  ~VisionService();

  // Loads the tower, creates the pool, connects, starts the metrics listener.
  Status start();
  void run();
  void request_stop() { stop_.store(true); }
  std::atomic<bool>* stop_flag() { return &stop_; }

  // One encode, as the work thread serves it (exposed for tests of the service's logic).
  proto::EncodeImageReply encode(const proto::EncodeImageRequest& request, std::string_view bytes);
  const proto::VisionHeartbeat& heartbeat() const { return heartbeat_; }

 private:
  struct Impl;
  void work_main();
  std::string ready_reason() const;

  VisionOptions options_;
  std::unique_ptr<Impl> impl_;
  uint64_t incarnation_ = 0;
  proto::VisionHeartbeat heartbeat_;
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
  prometheus::Counter* encodes_ = nullptr;
  prometheus::Counter* bad_images_ = nullptr;
  prometheus::Counter* encode_errors_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
  prometheus::Gauge* pool_slots_ = nullptr;
  prometheus::Gauge* pool_bytes_ = nullptr;
};

}  // namespace litellama
