#include "services/vision/service/vision_service.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/log.h"
#include "common/net/metric_families.h"
#include "common/net/zmq_util.h"
#include "services/vision/clip_preprocess.h"
#include "services/vision/embedding_pool.h"
#include "services/vision/image_decode.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;

constexpr const char* kWorkEndpoint = "inproc://vision-work";
constexpr const char* kStopWork = "stop";

prometheus::Histogram::BucketBoundaries encode_buckets() {
  return {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0};
}

// A decode or preprocessing failure is the image's (the client's) fault; anything else is ours.
bool is_bad_image(const Status& st) {
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kDataLoss ||
         st.code() == StatusCode::kResourceExhausted;
}

}  // namespace

struct VisionService::Impl {
  std::unique_ptr<vision::LlavaVisionEncoder> encoder;
  vision::ClipPreprocessConfig preprocess;
  std::unique_ptr<EmbeddingPool> pool;
};

VisionService::VisionService(VisionOptions options)
    : options_(std::move(options)),
      impl_(std::make_unique<Impl>()),
      registry_(std::make_shared<prometheus::Registry>()) {
  incarnation_ = net::random_id();
  auto& r = *registry_;
  encode_duration_ = net::histogram(
      r, "litellama_vision_encode_seconds",
      "Time to encode one image: decode, preprocess, tower and projector", encode_buckets());
  encodes_ = net::counter(r, "litellama_vision_encodes_total", "Images encoded into the pool");
  bad_images_ =
      net::counter(r, "litellama_vision_bad_images_total",
                   "Images refused: not JPEG/PNG, truncated, too large or too many pixels");
  encode_errors_ = net::counter(r, "litellama_vision_encode_errors_total",
                                "Encodes that failed for another reason than the image");
  protocol_errors_ =
      net::counter(r, "litellama_vision_protocol_errors_total", "Unknown or malformed messages");
  pool_slots_ = net::gauge(r, "litellama_vision_pool_slots", "Image slots of the embedding pool");
  pool_bytes_ = net::gauge(r, "litellama_vision_pool_bytes", "Bytes of the embedding pool");
}

VisionService::~VisionService() {
  stop_.store(true);
  if (work_thread_.joinable()) {
    try {
      (void)net::send_one(work_io_, kStopWork);
    } catch (const zmq::error_t&) {
    }
    work_thread_.join();
  }
}

std::string VisionService::ready_reason() const {
  if (!loaded_.load()) return "loading the vision tower";
  if (monotonic_seconds() - last_scheduler_seen_.load() > options_.peer_timeout_ms / 1000.0) {
    return "the scheduler is down";
  }
  return "";
}

Status VisionService::start() {
  LITELLAMA_RETURN_IF_ERROR(
      net::check_liveness_flags(options_.heartbeat_interval_ms, options_.peer_timeout_ms));
  if (options_.device != "cpu") {
    return make_error(StatusCode::kUnsupported,
                      "--device {}: the vision service runs its tower on the CPU only so far (the "
                      "CUDA tower and a device pool shared through CUDA IPC are not built yet)",
                      options_.device);
  }
  if (options_.max_image_bytes < 1) {
    return make_error(StatusCode::kInvalidArgument, "--max-image-bytes must be positive");
  }
  LITELLAMA_RETURN_IF_ERROR(
      net::prepare_endpoint(options_.scheduler_endpoint, options_.allow_insecure_tcp));
  if (!options_.metrics_listen.empty()) {
    LITELLAMA_ASSIGN_OR_RETURN(metrics_,
                               net::MetricsServer::start(options_.metrics_listen, registry_,
                                                         [this] { return ready_reason(); }));
  }
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options_.model_dir));
  if (checkpoint.llava() == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not a LLaVA checkpoint: the vision service needs a vision tower",
                      options_.model_dir);
  }
  LITELLAMA_ASSIGN_OR_RETURN(impl_->encoder,
                             vision::LlavaVisionEncoder::load(checkpoint, options_.n_threads));
  LITELLAMA_ASSIGN_OR_RETURN(impl_->preprocess,
                             vision::load_clip_preprocess_config(options_.model_dir));
  impl_->preprocess.pad_to_square = options_.pad_to_square;
  const LlavaConfig& cfg = impl_->encoder->config();

  EmbeddingPoolGeometry geometry;
  geometry.rows_per_slot = cfg.n_image_tokens();
  geometry.hidden = cfg.text_hidden_size;
  const int64_t slot_bytes = int64_t{geometry.rows_per_slot} * geometry.hidden * 4;
  geometry.n_slots = static_cast<int32_t>(
      std::clamp<int64_t>(options_.pool_bytes / std::max<int64_t>(slot_bytes, 1), 1, 1 << 20));
  const std::string pool_name = options_.pool_name.empty()
                                    ? fmt::format("litellama-vision-{:016x}", incarnation_)
                                    : options_.pool_name;
  LITELLAMA_ASSIGN_OR_RETURN(impl_->pool, EmbeddingPool::create(pool_name, geometry, incarnation_));
  pool_slots_->Set(geometry.n_slots);
  pool_bytes_->Set(static_cast<double>(impl_->pool->size_bytes()));

  heartbeat_.incarnation = incarnation_;
  heartbeat_.model = options_.model_dir;
  heartbeat_.device = options_.device;
  heartbeat_.pool_name = pool_name;
  heartbeat_.n_slots = geometry.n_slots;
  heartbeat_.rows_per_slot = geometry.rows_per_slot;
  heartbeat_.hidden = geometry.hidden;
  heartbeat_.image_token_id = cfg.image_token_id;
  heartbeat_.max_image_bytes = options_.max_image_bytes;
  loaded_.store(true);

  try {
    scheduler_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    net::configure_socket(scheduler_);
    scheduler_.set(zmq::sockopt::routing_id, fmt::format("vision-{:016x}", incarnation_));
    scheduler_.connect(options_.scheduler_endpoint);
    work_io_ = zmq::socket_t(context_, zmq::socket_type::pair);
    work_io_.set(zmq::sockopt::linger, 0);
    work_io_.bind(kWorkEndpoint);
  } catch (const zmq::error_t& e) {
    return make_error(StatusCode::kUnavailable, "cannot connect to '{}': {}",
                      options_.scheduler_endpoint, e.what());
  }
  LITELLAMA_LOG_INFO(
      "vision: {} loaded ({} image tokens of {} per image), pool '{}' of {} slots ({} MiB), "
      "scheduler at {}, metrics on {}",
      options_.model_dir, geometry.rows_per_slot, geometry.hidden, pool_name, geometry.n_slots,
      impl_->pool->size_bytes() >> 20, options_.scheduler_endpoint,
      metrics_ ? std::to_string(metrics_->port()) : std::string("(off)"));
  work_thread_ = std::thread([this] { work_main(); });
  return Status::ok();
}

proto::EncodeImageReply VisionService::encode(const proto::EncodeImageRequest& request,
                                              std::string_view bytes) {
  const double start = monotonic_seconds();
  proto::EncodeImageReply reply;
  reply.op_id = request.op_id;
  reply.image_hash = request.image_hash;
  reply.slot = request.slot;
  auto fail = [&](const Status& st, bool bad_image) {
    reply.error = st.to_string();
    reply.bad_image = bad_image;
    (bad_image ? bad_images_ : encode_errors_)->Increment();
    return reply;
  };
  const EmbeddingPoolGeometry& g = impl_->pool->geometry();
  if (request.slot < 0 || request.slot >= g.n_slots) {
    return fail(make_error(StatusCode::kInvalidArgument, "slot {} is outside the pool of {} slots",
                           request.slot, g.n_slots),
                false);
  }
  if (static_cast<int64_t>(bytes.size()) > options_.max_image_bytes) {
    return fail(make_error(StatusCode::kInvalidArgument,
                           "the image is {} bytes, over the limit of {} bytes", bytes.size(),
                           options_.max_image_bytes),
                true);
  }
  const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto image = vision::decode_image(data);
  if (!image) return fail(image.status(), is_bad_image(image.status()));
  auto pixels = vision::clip_preprocess(*image, impl_->preprocess);
  if (!pixels) return fail(pixels.status(), is_bad_image(pixels.status()));
  auto rows = impl_->encoder->encode(*pixels);
  if (!rows) return fail(rows.status(), false);
  const size_t expected = static_cast<size_t>(g.rows_per_slot) * static_cast<size_t>(g.hidden);
  if (rows->size() != expected) {
    return fail(make_error(StatusCode::kInternal, "the encoder gave {} values, the slot holds {}",
                           rows->size(), expected),
                false);
  }
  std::span<float> slot = impl_->pool->rows(request.slot);
  std::memcpy(slot.data(), rows->data(), expected * sizeof(float));
  reply.n_rows = g.rows_per_slot;
  reply.encode_seconds = monotonic_seconds() - start;
  reply.finished_unix_ns = net::unix_now_ns();
  encodes_->Increment();
  encode_duration_->Observe(reply.encode_seconds);
  return reply;
}

void VisionService::work_main() {
  zmq::socket_t io(context_, zmq::socket_type::pair);
  io.set(zmq::sockopt::linger, 0);
  io.set(zmq::sockopt::rcvtimeo, 200);
  io.connect(kWorkEndpoint);
  std::vector<zmq::message_t> frames;
  while (!stop_.load()) {
    zmq::message_t msg;
    if (!io.recv(msg, zmq::recv_flags::none)) continue;
    if (frame_view(msg) == kStopWork) break;
    // The I/O thread forwards [request, image bytes] as two frames.
    zmq::message_t image;
    if (msg.more()) (void)io.recv(image, zmq::recv_flags::none);
    while (image.more()) {  // never more than two; drain anything else
      zmq::message_t extra;
      (void)io.recv(extra, zmq::recv_flags::none);
      if (!extra.more()) break;
    }
    auto request = proto::decode<proto::EncodeImageRequest>(frame_view(msg));
    if (!request) {
      protocol_errors_->Increment();
      continue;
    }
    const std::string reply = proto::encode(encode(*request, frame_view(image)));
    io.send(zmq::buffer(reply), zmq::send_flags::none);
  }
}

void VisionService::run() {
  std::vector<zmq::message_t> frames;
  double last_heartbeat = 0.0;
  const std::string hb_bytes = proto::encode(heartbeat_);
  while (!stop_.load()) {
    const double now = monotonic_seconds();
    if (now - last_heartbeat >= options_.heartbeat_interval_ms / 1000.0) {
      last_heartbeat = now;
      (void)net::send_one(scheduler_, hb_bytes);
    }
    net::wait_readable({&scheduler_, &work_io_}, std::max(1, options_.heartbeat_interval_ms / 2));
    net::forward_waiting(work_io_, scheduler_, &frames);
    while (net::recv_frames(scheduler_, &frames)) {
      if (frames.empty()) continue;
      auto envelope = proto::Envelope::parse(frame_view(frames[0]));
      if (!envelope) {
        protocol_errors_->Increment();
        LITELLAMA_LOG_WARN("vision: dropped a message: {}", envelope.status().to_string());
        continue;
      }
      last_scheduler_seen_.store(monotonic_seconds());
      switch (envelope->type()) {
        case proto::MessageType::kSchedulerHeartbeat:
          break;
        case proto::MessageType::kEncodeImageRequest: {
          // [request] or [request, bytes]; a missing bytes frame reaches encode() as an empty
          // image, which it refuses as the client's.
          if (frames.size() > 2) {
            protocol_errors_->Increment();
            LITELLAMA_LOG_WARN("vision: dropped an encode request of {} frames", frames.size());
            break;
          }
          const bool with_bytes = frames.size() == 2;
          (void)work_io_.send(frames[0],
                              with_bytes ? zmq::send_flags::sndmore : zmq::send_flags::none);
          if (with_bytes) (void)work_io_.send(frames[1], zmq::send_flags::none);
          break;
        }
        default:
          protocol_errors_->Increment();
          LITELLAMA_LOG_WARN("vision: dropped an unexpected '{}' message",
                             proto::message_type_name(envelope->type()));
      }
    }
  }
  (void)net::send_one(work_io_, kStopWork);
  if (work_thread_.joinable()) work_thread_.join();
  LITELLAMA_LOG_INFO("vision: stopped");
}

}  // namespace litellama
