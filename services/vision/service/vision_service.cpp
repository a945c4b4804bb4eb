#include "services/vision/service/vision_service.h"

#include <algorithm>
#include <cstdlib>
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
#include "services/worker/model_runner.h"
#if LITELLAMA_VISION_CUDA
#include "kernels/gpu_runtime.h"
#include "services/vision/cuda/cuda_vision_encoder.h"
#include "services/worker/cuda/device_buffer.h"
#endif

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;

prometheus::Histogram::BucketBoundaries encode_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01,
          0.02,   0.05,    0.1,    0.2,   0.5,    1.0,   2.0,   5.0,   10.0};
}

// A decode or preprocessing failure is the image's (the client's) fault; anything else is ours.
bool is_bad_image(const Status& st) {
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kDataLoss ||
         st.code() == StatusCode::kResourceExhausted;
}

}  // namespace

struct VisionService::Impl {
  std::unique_ptr<vision::LlavaVisionEncoder> encoder;  // --device cpu
#if LITELLAMA_VISION_CUDA
  std::unique_ptr<vision::CudaVisionEncoder> cuda_encoder;  // --device cuda
  std::unique_ptr<vision::DevicePoolRows> device_rows;      // the device pool's rows
#endif
  vision::ClipPreprocessConfig preprocess;
  std::unique_ptr<EmbeddingPool> pool;  // destroyed before device_rows: the header goes first
  // A device encode announced before it finished (its metrics are observed when it has).
  bool encode_in_flight = false;
  double encode_start = 0.0;
};

VisionService::VisionService(VisionOptions options)
    : options_(std::move(options)),
      impl_(std::make_unique<Impl>()),
      registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  encode_duration_ = net::histogram(
      r, "litellama_vision_encode_seconds",
      "Time to encode one image: decode, preprocess, tower and projector", encode_buckets());
  encode_device_duration_ = net::histogram(
      r, "litellama_vision_encode_device_seconds",
      "Device time of one encode on a GPU: image upload, preprocessing, tower and projector",
      encode_buckets());
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
  net::WorkThreadServiceConfig loop;
  loop.name = "vision";
  loop.peer = options_;
  // [encode_image_request, image bytes]: the bytes frame may be missing (an error reply).
  loop.work_types = {proto::MessageType::kEncodeImageRequest};
  loop.max_work_frames = 2;
  loop.loading_what = "loading the vision tower";
  loop_ = std::make_unique<net::WorkThreadService>(std::move(loop), registry_, protocol_errors_);
}

VisionService::~VisionService() = default;

Status VisionService::start() {
#if !LITELLAMA_VISION_CUDA
  if (options_.device != "cpu") {
    return make_error(StatusCode::kUnsupported,
                      "--device {}: this build of litellama-vision has no CUDA backend (built "
                      "without the CUDA toolkit)",
                      options_.device);
  }
#endif
  if (options_.max_image_bytes < 1) {
    return make_error(StatusCode::kInvalidArgument, "--max-image-bytes must be positive");
  }
  LITELLAMA_RETURN_IF_ERROR(loop_->prepare());
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options_.model_dir));
  if (checkpoint.llava() == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not a LLaVA checkpoint: the vision service needs a vision tower",
                      options_.model_dir);
  }
  LITELLAMA_ASSIGN_OR_RETURN(impl_->preprocess,
                             vision::load_clip_preprocess_config(options_.model_dir));
  impl_->preprocess.pad_to_square = options_.pad_to_square;
  const bool on_gpu = options_.device == "cuda";
  std::string backend = "cpu float32";
  if (!on_gpu) {
    LITELLAMA_ASSIGN_OR_RETURN(impl_->encoder,
                               vision::LlavaVisionEncoder::load(checkpoint, options_.n_threads));
  }
#if LITELLAMA_VISION_CUDA
  if (on_gpu) {
    int n_devices = 0;
    if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0) {
      (void)cudaGetLastError();
      return make_error(StatusCode::kUnavailable, "--device cuda: no CUDA device is visible");
    }
    LITELLAMA_ASSIGN_OR_RETURN(
        const DType dtype,
        resolve_compute_dtype(Device::kCuda, options_.dtype, checkpoint.config().torch_dtype));
    LITELLAMA_ASSIGN_OR_RETURN(impl_->cuda_encoder,
                               vision::CudaVisionEncoder::load(checkpoint, dtype));
    // Two encodes of a plain image: the first runs the tower eagerly (lazy module loading,
    // cuBLAS's choices), the second captures its graph, so that no request pays for either.
    vision::RgbImage blank;
    blank.width = blank.height = checkpoint.llava()->vision.image_size;
    blank.pixels.assign(static_cast<size_t>(blank.width) * blank.height * 3, 128);
    LITELLAMA_ASSIGN_OR_RETURN(
        DeviceBuffer scratch,
        DeviceBuffer::allocate(static_cast<size_t>(checkpoint.llava()->n_image_tokens()) *
                               checkpoint.llava()->text_hidden_size * sizeof(float)));
    for (int i = 0; i < 2; ++i) {
      LITELLAMA_RETURN_IF_ERROR(impl_->cuda_encoder->enqueue_image(blank, impl_->preprocess,
                                                                   scratch.as<float>(), nullptr));
      LITELLAMA_RETURN_IF_ERROR(impl_->cuda_encoder->finish());
    }
    backend =
        fmt::format("cuda {}, {} MiB of weights and {} MiB of workspaces on the device, tower {}",
                    dtype_torch_name(dtype), impl_->cuda_encoder->weight_bytes() >> 20,
                    impl_->cuda_encoder->workspace_bytes() >> 20,
                    impl_->cuda_encoder->tower_graph() ? "as a CUDA graph" : "launched eagerly");
  }
#endif
  const LlavaConfig& cfg = *checkpoint.llava();

  EmbeddingPoolGeometry geometry;
  geometry.rows_per_slot = cfg.n_image_tokens();
  geometry.hidden = cfg.text_hidden_size;
  const int64_t slot_bytes = int64_t{geometry.rows_per_slot} * geometry.hidden * 4;
  geometry.n_slots = static_cast<int32_t>(
      std::clamp<int64_t>(options_.pool_bytes / std::max<int64_t>(slot_bytes, 1), 1, 1 << 20));
  const std::string pool_name = options_.pool_name.empty()
                                    ? fmt::format("litellama-vision-{:016x}", loop_->incarnation())
                                    : options_.pool_name;
  const EmbeddingPoolDevice* device_export = nullptr;
#if LITELLAMA_VISION_CUDA
  if (on_gpu) {
    LITELLAMA_ASSIGN_OR_RETURN(
        impl_->device_rows, vision::DevicePoolRows::allocate(EmbeddingPool::rows_bytes(geometry)));
    device_export = &impl_->device_rows->exported();
  }
#endif
  LITELLAMA_ASSIGN_OR_RETURN(
      impl_->pool, EmbeddingPool::create(pool_name, geometry, loop_->incarnation(), device_export));
  pool_slots_->Set(geometry.n_slots);
  pool_bytes_->Set(static_cast<double>(impl_->pool->size_bytes()));

  heartbeat_.incarnation = loop_->incarnation();
  heartbeat_.model = options_.model_dir;
  heartbeat_.device = options_.device;
  heartbeat_.pool_name = pool_name;
  heartbeat_.n_slots = geometry.n_slots;
  heartbeat_.rows_per_slot = geometry.rows_per_slot;
  heartbeat_.hidden = geometry.hidden;
  heartbeat_.image_token_id = cfg.image_token_id;
  heartbeat_.max_image_bytes = options_.max_image_bytes;
  loop_->mark_loaded();
  LITELLAMA_RETURN_IF_ERROR(
      loop_->connect([this](std::vector<zmq::message_t>& frames) { return serve(frames); },
                     [this] { after_reply(); }));
  LITELLAMA_LOG_INFO(
      "vision: {} loaded on {} ({} image tokens of {} per image), pool '{}' of {} slots ({} MiB, "
      "{}), scheduler at {}, metrics on {}",
      options_.model_dir, backend, geometry.rows_per_slot, geometry.hidden, pool_name,
      geometry.n_slots, impl_->pool->size_bytes() >> 20,
      on_gpu ? "device memory shared through CUDA IPC" : "shared memory",
      options_.scheduler_endpoint, loop_->metrics_port());
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
#if LITELLAMA_VISION_CUDA
  if (impl_->cuda_encoder) {
    // In place: the tower's last GEMM writes the slot's rows in device memory. Preprocessing runs
    // on the device too. The reply goes out as soon as the work is queued: the worker waits for
    // the pool's ready event (recorded after the rows' last write, before this reply) and reads
    // the rows the moment the device has written them, while the messages that announce them
    // travel in the meantime. after_reply() then waits for the device.
    float* slot = impl_->device_rows->data() +
                  impl_->pool->row_index(request.slot, 0) * static_cast<int64_t>(g.hidden);
    if (Status st = impl_->cuda_encoder->enqueue_image(*image, impl_->preprocess, slot,
                                                       impl_->device_rows.get());
        !st) {
      return fail(st, is_bad_image(st));
    }
    impl_->encode_in_flight = true;
    impl_->encode_start = start;
    reply.n_rows = g.rows_per_slot;
    reply.encode_seconds = monotonic_seconds() - start;
    reply.finished_unix_ns = net::unix_now_ns();
    encodes_->Increment();
    return reply;
  }
#endif
  auto pixels = vision::clip_preprocess(*image, impl_->preprocess);
  if (!pixels) return fail(pixels.status(), is_bad_image(pixels.status()));
  if (impl_->encoder) {
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
  }
  reply.n_rows = g.rows_per_slot;
  reply.encode_seconds = monotonic_seconds() - start;
  reply.finished_unix_ns = net::unix_now_ns();
  encodes_->Increment();
  encode_duration_->Observe(reply.encode_seconds);
  return reply;
}

std::string VisionService::serve(std::vector<zmq::message_t>& frames) {
  auto request = proto::decode<proto::EncodeImageRequest>(frame_view(frames[0]));
  if (!request) {
    protocol_errors_->Increment();
    return "";
  }
  // A missing bytes frame reaches encode() as an empty image, which it refuses as the client's.
  const std::string_view bytes = frames.size() > 1 ? frame_view(frames[1]) : std::string_view();
  return proto::encode(encode(*request, bytes));
}

void VisionService::after_reply() {
#if LITELLAMA_VISION_CUDA
  if (!impl_->encode_in_flight) return;
  impl_->encode_in_flight = false;
  if (Status st = impl_->cuda_encoder->finish(); !st) {
    // The rows were announced and may be read already: nothing this process writes can be
    // trusted after a device fault (CUDA's are sticky). Its supervisor starts a new one, which the
    // scheduler and the worker take up as after any vision restart.
    LITELLAMA_LOG_ERROR("vision: the device failed during an announced encode: {}; exiting",
                        st.to_string());
    spdlog::default_logger()->flush();
    std::_Exit(70);
  }
  encode_duration_->Observe(monotonic_seconds() - impl_->encode_start);
  encode_device_duration_->Observe(impl_->cuda_encoder->last_device_seconds());
#endif
}

void VisionService::run() {
  loop_->run(proto::encode(heartbeat_));
}

}  // namespace litellama
