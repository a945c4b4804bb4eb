// LlavaVisionEncoder: LLaVA's image path on the CPU in float32, from pixel_values to the rows
// that replace the image tokens' embeddings in the text model's prefill.
//
//   CLIP vision tower (transformers' CLIPVisionTransformer):
//     patch embedding: a p x p, stride-p convolution without bias, computed as a matmul of the
//       flattened patches [n_patches, 3 p p] by the kernel [hidden, 3 p p]
//     [class_embedding; patches] + position_embedding, then pre_layrnorm
//     encoder layers: x += attn(layer_norm1(x)) (q/k/v/out with bias, softmax(q k^T / sqrt(d)),
//       no mask); x += fc2(quick_gelu(fc1(layer_norm2(x)))), quick_gelu(x) = x sigmoid(1.702 x)
//     features: hidden state vision_feature_layer (0 is the pre_layrnorm output), so only that many
//       layers run; the "default" strategy drops the class token's row
//   projector (LlavaMultiModalProjector): linear_2(gelu(linear_1(features))), gelu exact (erf)
//
// The output is [n_image_tokens, text_hidden] float32, row i for the i-th image token of the
// prompt. The encoder keeps its own float32 copy of the weights; the checkpoint may be closed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "services/vision/clip_preprocess.h"
#include "services/worker/llava_config.h"

namespace litellama {
class Checkpoint;
}

namespace litellama::vision {

// The patch convolution's input as a matrix: [n_patches, 3 * patch_size^2] rows of square pixel
// values [3, side * patch_size, side * patch_size], each patch in the kernel's (channel, ky, kx)
// order, patches row by row (the convolution output's flatten(2) order).
std::vector<float> flatten_patches(const PixelValues& pixels, int32_t patch_size);

// kInvalidArgument unless the pixel values are [3, image_size, image_size] of the tower.
Status check_pixel_values(const PixelValues& pixels, const ClipVisionConfig& vision);

class LlavaVisionEncoder {
 public:
  // Loads the vision tower and projector of a LLaVA checkpoint (either published layout).
  // kInvalidArgument when the checkpoint is not LLaVA. n_threads 0: all hardware threads.
  static Result<std::unique_ptr<LlavaVisionEncoder>> load(const Checkpoint& checkpoint,
                                                          int32_t n_threads = 0);

  const LlavaConfig& config() const { return config_; }

  // The selected hidden state of the vision tower: [n_image_tokens, vision_hidden]. The pixel
  // values must be [3, image_size, image_size] (the processor's crop size for LLaVA).
  Result<std::vector<float>> vision_features(const PixelValues& pixels) const;
  // The projector over vision features: [n_rows, text_hidden].
  Result<std::vector<float>> project(const std::vector<float>& features) const;
  // Both: the image-token embeddings of one image, [n_image_tokens, text_hidden].
  Result<std::vector<float>> encode(const PixelValues& pixels) const;

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, wq, bq, wk, bk, wv, bv, wo, bo;
    std::vector<float> ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };

  LlavaVisionEncoder() = default;
  // out[t, n] = sum_k in[t, k] w[n, k] + bias[n]
  void linear(float* out, const float* in, const std::vector<float>& w,
              const std::vector<float>& bias, int64_t n_rows, int64_t n_out, int64_t n_in) const;
  void layer_norm(float* out, const float* in, const std::vector<float>& w,
                  const std::vector<float>& b, int64_t n_rows, int64_t dim) const;
  void attention(float* out, const float* q, const float* k, const float* v,
                 int64_t n_tokens) const;

  LlavaConfig config_;
  int32_t n_threads_ = 1;
  std::vector<float> class_embedding_, patch_weight_, position_embedding_, pre_ln_w_, pre_ln_b_;
  std::vector<Layer> layers_;  // the n_layers_used() layers the features need
  std::vector<float> proj1_w_, proj1_b_, proj2_w_, proj2_b_;
};

}  // namespace litellama::vision
