// LlavaConfig: the vision half of a LlavaForConditionalGeneration config.json (the text half is
// ModelConfig), and the tensor names of its CLIP vision tower and projector in both published
// layouts. It lives beside the checkpoint loader so that the loader, the random-checkpoint
// generator and the vision tower (services/vision/) read one table.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace litellama {

// CLIPVisionConfig (transformers' defaults where config.json leaves a key out).
struct ClipVisionConfig {
  int32_t hidden_size = 768;
  int32_t intermediate_size = 3072;
  int32_t n_layers = 12;
  int32_t n_heads = 12;
  int32_t n_channels = 3;
  int32_t image_size = 224;
  int32_t patch_size = 32;
  double layer_norm_eps = 1e-5;

  int32_t head_dim() const { return hidden_size / n_heads; }
  int32_t n_patches_per_side() const { return image_size / patch_size; }
  int32_t n_patches() const { return n_patches_per_side() * n_patches_per_side(); }
  int32_t n_positions() const { return n_patches() + 1; }  // the class token first
};

enum class VisionFeatureSelect {
  kDefault,  // drop the class token
  kFull,     // keep it
};

struct LlavaConfig {
  ClipVisionConfig vision;
  int32_t text_hidden_size = 0;
  // Index into the vision tower's hidden states (0: the embeddings after pre_layrnorm, i: after
  // encoder layer i); negative counts from the end (-1: the last layer's output).
  int32_t vision_feature_layer = -2;
  VisionFeatureSelect feature_select = VisionFeatureSelect::kDefault;
  bool projector_bias = true;
  int32_t image_token_id = 32000;
  int32_t image_seq_length = 576;

  // Encoder layers run to reach vision_feature_layer (resolved against n_layers).
  int32_t n_layers_used() const;
  // Feature rows per image: n_patches, plus the class token for kFull.
  int32_t n_image_tokens() const;
};

// The largest image (in pixels, for each of the decoded image, the resize's intermediate rows and
// the resized image) that the vision service on a GPU preprocesses on the device; larger ones are
// preprocessed on the host (services/vision/cuda/cuda_vision_encoder.h).
inline constexpr int64_t kVisionDevicePreprocessPixels = int64_t{16} << 20;
// Device bytes of the vision service's cuBLAS workspace (set on its handle for graph capture).
inline constexpr int64_t kVisionCublasWorkspaceBytes = int64_t{32} << 20;

// What a vision service on a GPU holds for this model (services/vision/cuda/): the weights of the
// layers it runs and of the projector in `elem_bytes` per value, its workspaces (device
// preprocessing of images up to kVisionDevicePreprocessPixels and cuBLAS's included), the
// embedding pool of `pool_bytes` (whole slots of float32 rows), and 1 GiB for the process's CUDA
// context. An upper bound, so that a worker on the same GPU can leave it that much
// (RunnerOptions::reserve_device_bytes) before the vision service has started.
int64_t llava_vision_device_bytes(const LlavaConfig& config, int64_t elem_bytes,
                                  int64_t pool_bytes);

// Parses the LLaVA parts of config.json (which must be a LLaVA config). Errors name the key.
Result<LlavaConfig> parse_llava_config(const nlohmann::json& json);
Result<LlavaConfig> parse_llava_config(const std::string& json_text);

// Tensor names of the vision tower and projector. `vision_prefix` is "vision_tower." (LLaVA-1.5
// as published) or "model.vision_tower." (transformers' newer layout); projector_prefix likewise
// "multi_modal_projector." or "model.multi_modal_projector.".
struct LlavaTensorNames {
  std::string vision_prefix = "vision_tower.";
  std::string projector_prefix = "multi_modal_projector.";

  std::string vision(const std::string& rest) const {
    return vision_prefix + "vision_model." + rest;
  }
  std::string layer(int32_t l, const std::string& rest) const {
    return vision("encoder.layers." + std::to_string(l) + "." + rest);
  }
  std::string projector(const std::string& rest) const { return projector_prefix + rest; }
};

// Every tensor of the vision tower (all n_layers, and post_layernorm, which transformers keeps
// though LLaVA never uses it) and of the projector, with its shape, in a fixed order.
std::vector<std::pair<std::string, std::vector<int64_t>>> llava_vision_tensor_specs(
    const LlavaConfig& config, const LlavaTensorNames& names);

}  // namespace litellama
