// CudaVisionEncoder: LlavaVisionEncoder's computation (services/vision/llava_vision_encoder.h) on
// the GPU, in float32, bf16 or fp16, writing each image's [n_image_tokens, text_hidden] rows as
// float32 straight into device memory (a slot of the vision service's device embedding pool).
//
// Per image: the decoded bytes are copied up once, with the host's preprocessing plan
// (plan_clip_preprocess: Pillow's resampling coefficients, the crop, a value table per channel),
// and kernels/image_preprocess.h applies it bit for bit as the host would, writing the patch
// convolution's input rows (images above kVisionDevicePreprocessPixels are preprocessed on the
// host instead, which bounds the device memory this takes). Then the tower and projector: the
// patch convolution as a GEMM; per encoder layer a fused q/k/v GEMM with its bias, dense
// attention (kernels/vision_ops.h: two batched GEMMs around a float32 softmax), the output GEMM
// whose bias and residual add run fused with the next LayerNorm, the MLP's GEMMs around bias +
// quick_gelu (the second one's bias and residual again fused with the next LayerNorm); the
// projector's two GEMMs, exact GELU between, the last one writing float32 rows into the
// destination. GEMMs are cuBLAS (kernels/linear.h). Everything from the patch rows to the
// projector's first GEMM is one CUDA graph (captured on the second encode, replayed after: its
// buffers never move); the last GEMM, whose destination is the slot, and its bias are launched
// directly.
//
// Encodes are asynchronous: enqueue_image returns once the work is queued on the encoder's
// stream, after the pool's completion signals (DevicePoolRows: a GPU timestamp and an
// interprocess event recorded after the last write); finish() waits for it. What must stay true:
// a reader of the rows waits for the pool's ready event (recorded before the rows are announced)
// before reading them, and the host buffers of one encode are not reused before finish().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "services/vision/clip_preprocess.h"
#include "services/vision/embedding_pool.h"
#include "services/worker/llava_config.h"

namespace litellama {
class Checkpoint;
}

namespace litellama::vision {

// The device allocation that holds a device EmbeddingPool's rows, zeroed, followed by the
// "rows complete" timestamp word, and its export for other processes (CUDA IPC handles of the
// allocation and of the pool's interprocess ready event, and the GPU's UUID). Freed on
// destruction: a process that mapped it must be done with it first (the scheduler fails requests
// whose rows are gone).
class DevicePoolRows {
 public:
  static Result<std::unique_ptr<DevicePoolRows>> allocate(uint64_t rows_bytes);
  ~DevicePoolRows();
  DevicePoolRows(const DevicePoolRows&) = delete;
  DevicePoolRows& operator=(const DevicePoolRows&) = delete;
  float* data() const { return data_; }
  const EmbeddingPoolDevice& exported() const { return exported_; }
  // The word the encoder's stream stamps with the GPU time when an encode's rows are complete.
  uint64_t* finished_ns() const { return finished_ns_; }
  // The interprocess event (a cudaEvent_t) recorded after each encode.
  void* ready_event() const { return ready_event_; }

 private:
  DevicePoolRows() = default;
  float* data_ = nullptr;
  uint64_t* finished_ns_ = nullptr;
  void* ready_event_ = nullptr;
  EmbeddingPoolDevice exported_;
};

class CudaVisionEncoder {
 public:
  // Loads the tower and projector of a LLaVA checkpoint onto the current device.
  static Result<std::unique_ptr<CudaVisionEncoder>> load(const Checkpoint& checkpoint, DType dtype);
  ~CudaVisionEncoder();
  CudaVisionEncoder(const CudaVisionEncoder&) = delete;
  CudaVisionEncoder& operator=(const CudaVisionEncoder&) = delete;

  const LlavaConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  // Device bytes of the weights and of the workspaces.
  size_t weight_bytes() const { return weight_bytes_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

  // Queues the encode of a decoded image into dst ([n_image_tokens, text_hidden] float32 rows in
  // device memory of this device): preprocessing as `preprocess` says, tower, projector; then,
  // with a pool, stamps pool->finished_ns() and records pool->ready_event(). Returns once queued
  // (waiting first for an earlier encode still in flight); errors in the image or its
  // preprocessing (too small, unsupported resample) are returned before anything is queued.
  Status enqueue_image(const RgbImage& image, const ClipPreprocessConfig& preprocess, float* dst,
                       const DevicePoolRows* pool);
  // Waits for the encode in flight (none: returns at once); last_device_seconds() is then its
  // device time.
  Status finish();
  // Encodes pixel values preprocessed on the host into dst and waits for the rows.
  Status encode_to_device(const PixelValues& pixels, float* dst);
  // The same rows copied to the host (tests).
  Result<std::vector<float>> encode(const PixelValues& pixels);
  // The device preprocessing of an image as the patch rows it writes, [n_patches, 3 p p] converted
  // to float32 (tests compare them with the host's flatten_patches(clip_preprocess(...))). The
  // plan's output must be the tower's image size.
  Result<std::vector<float>> preprocess_on_device(const RgbImage& image,
                                                  const ClipPreprocessConfig& preprocess);
  // The selected hidden state of the tower, [n_image_tokens, vision_hidden], as float32 on the
  // host (tests compare it with the CPU encoder's).
  Result<std::vector<float>> vision_features(const PixelValues& pixels);
  // Device time of the last finished encode (from its upload to its last write).
  double last_device_seconds() const { return last_device_seconds_; }
  // Encodes whose tower ran as a replayed CUDA graph; whether the tower runs as one (false once
  // a capture was refused: it then runs eagerly).
  int64_t graph_replays() const;
  bool tower_graph() const;

 private:
  struct Impl;
  CudaVisionEncoder() = default;
  // Queues the preprocessing of `image` into the patch rows.
  Status enqueue_preprocess(const RgbImage& image, const ClipPreprocessConfig& preprocess);
  // Queues the copy of host-flattened patches of `pixels` into the patch rows.
  Status enqueue_patches(const PixelValues& pixels);
  // Queues the tower (from the patch rows) and, with dst, the projector into dst.
  Status enqueue_tower_and_projector(float* dst, const DevicePoolRows* pool);
  Status run_tower();
  Status run_projector_head();

  LlavaConfig config_;
  DType dtype_ = DType::kF32;
  size_t weight_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  double last_device_seconds_ = 0.0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace litellama::vision
