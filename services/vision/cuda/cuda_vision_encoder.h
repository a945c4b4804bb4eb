// CudaVisionEncoder: LlavaVisionEncoder's computation (services/vision/llava_vision_encoder.h) on
// the GPU, in float32, bf16 or fp16, writing each image's [n_image_tokens, text_hidden] rows as
// float32 straight into device memory (a slot of the vision service's device embedding pool).
//
// Per image: the pixel values are flattened into patches on the host and copied up (the one
// host-to-device copy); the patch convolution is a GEMM; then per encoder layer a fused q/k/v
// GEMM, dense attention (kernels/vision_ops.h), the output GEMM with bias and residual, and the
// MLP's two GEMMs around bias + quick_gelu; finally the projector's two GEMMs (exact GELU between),
// the last one writing float32 rows into the destination. GEMMs are cuBLAS (kernels/linear.h),
// biases and activations one elementwise kernel each. The weights are uploaded once in the
// compute dtype (matrices) and float32 (norms, biases, embeddings).
//
// What must stay true: encode() returns only once the rows are complete in device memory (the
// stream is synchronized), since the rows are announced to other processes right after.
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

// The device allocation that holds a device EmbeddingPool's rows, zeroed, and its export for
// other processes (a CUDA IPC handle and the GPU's UUID). Freed on destruction: a process that
// mapped it must be done with it first (the scheduler fails requests whose rows are gone).
class DevicePoolRows {
 public:
  static Result<std::unique_ptr<DevicePoolRows>> allocate(uint64_t bytes);
  ~DevicePoolRows();
  DevicePoolRows(const DevicePoolRows&) = delete;
  DevicePoolRows& operator=(const DevicePoolRows&) = delete;
  float* data() const { return data_; }
  const EmbeddingPoolDevice& exported() const { return exported_; }

 private:
  DevicePoolRows() = default;
  float* data_ = nullptr;
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

  // Encodes one image into dst: [n_image_tokens, text_hidden] float32 rows in device memory of
  // this device. Returns when they are complete.
  Status encode_to_device(const PixelValues& pixels, float* dst);
  // The same rows copied to the host (tests).
  Result<std::vector<float>> encode(const PixelValues& pixels);
  // The selected hidden state of the tower, [n_image_tokens, vision_hidden], as float32 on the
  // host (tests compare it with the CPU encoder's).
  Result<std::vector<float>> vision_features(const PixelValues& pixels);
  // Device time of the last encode (tower and projector, from the patch upload on).
  double last_device_seconds() const { return last_device_seconds_; }

 private:
  struct Impl;
  CudaVisionEncoder() = default;
  Status run_tower(const PixelValues& pixels);
  Status run_projector(float* dst);

  LlavaConfig config_;
  DType dtype_ = DType::kF32;
  size_t weight_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  double last_device_seconds_ = 0.0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace litellama::vision
