// VisionService: the litellama-vision process. Connects a DEALER to the scheduler's vision
// endpoint, announces itself and its embedding pool with heartbeats, and encodes the images the
// scheduler sends (EncodeImageRequest + the image's bytes as a second frame) into the pool slot
// the request names: decode (JPEG/PNG), the checkpoint's CLIP preprocessing, the vision tower and
// the projector, rows written in place into the pool the worker reads (vision_messages.h).
//
// Two threads (net::WorkThreadService, as the tokenizer): the I/O thread (run()) owns the socket
// and sends heartbeats; the work thread encodes in arrival order, so a long encode never makes the
// service look dead. The pool is created at start and removed when the service stops; a
// restarted service is a new incarnation with a new, empty pool, which the scheduler learns from
// its heartbeat.
//
// Backends: --device cpu, the CPU encoder (services/vision/llava_vision_encoder.h) with a
// shared-memory pool; --device cuda (CUDA builds), the device encoder
// (services/vision/cuda/cuda_vision_encoder.h) writing into a device pool exported through CUDA
// IPC, which the worker maps and reads in place.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/net/work_thread_service.h"
#include "common/proto/vision_messages.h"
#include "common/status.h"

namespace litellama {

inline constexpr int64_t kDefaultMaxImageBytes = int64_t{20} << 20;
inline constexpr int64_t kDefaultVisionPoolBytes = int64_t{256} << 20;

// scheduler_endpoint: the scheduler's vision endpoint.
struct VisionOptions : net::PeerServiceOptions {
  std::string model_dir;  // a LLaVA checkpoint
  std::string device = "cpu";
  std::string dtype = "auto";  // --device cuda: the tower's compute dtype (as the worker's)
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
  void request_stop() { loop_->request_stop(); }
  std::atomic<bool>* stop_flag() { return loop_->stop_flag(); }

  // One encode, as the work thread serves it (exposed for tests of the service's logic).
  proto::EncodeImageReply encode(const proto::EncodeImageRequest& request, std::string_view bytes);
  const proto::VisionHeartbeat& heartbeat() const { return heartbeat_; }

 private:
  struct Impl;
  // Serves [encode_image_request, image bytes] on the work thread; "" when malformed (counted).
  std::string serve(std::vector<zmq::message_t>& frames);
  // On the work thread after each reply: waits for a device encode the reply announced.
  void after_reply();

  VisionOptions options_;
  std::unique_ptr<Impl> impl_;
  proto::VisionHeartbeat heartbeat_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* encode_duration_ = nullptr;
  prometheus::Histogram* encode_device_duration_ = nullptr;  // --device cuda
  prometheus::Counter* encodes_ = nullptr;
  prometheus::Counter* bad_images_ = nullptr;
  prometheus::Counter* encode_errors_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
  prometheus::Gauge* pool_slots_ = nullptr;
  prometheus::Gauge* pool_bytes_ = nullptr;
  // Last: destroyed first, so the work thread stops before the encoder and pool go.
  std::unique_ptr<net::WorkThreadService> loop_;
};

}  // namespace litellama
