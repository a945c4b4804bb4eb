#include "services/worker/llava_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "services/worker/model_config.h"

namespace litellama {

namespace {

using nlohmann::json;

Status read_int(const json& j, const char* where, const char* key, int32_t lo, int32_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > (1 << 24)) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: '{}{}' must be an integer of at least {}", where, key, lo);
  }
  *out = it->get<int32_t>();
  return Status::ok();
}

}  // namespace

int32_t LlavaConfig::n_layers_used() const {
  return vision_feature_layer >= 0 ? vision_feature_layer
                                   : vision.n_layers + 1 + vision_feature_layer;
}

int32_t LlavaConfig::n_image_tokens() const {
  return vision.n_patches() + (feature_select == VisionFeatureSelect::kFull ? 1 : 0);
}

int64_t llava_vision_device_bytes(const LlavaConfig& c, int64_t elem_bytes, int64_t pool_bytes) {
  const ClipVisionConfig& v = c.vision;
  const int64_t H = v.hidden_size, I = v.intermediate_size, th = c.text_hidden_size;
  const int64_t T = v.n_positions(), patch = int64_t{3} * v.patch_size * v.patch_size;
  const int64_t weights =
      int64_t{c.n_layers_used()} * (4 * H * H + 2 * H * I) + H * patch + H * th + th * th;
  // Activations (x, h, attn: [T, H]; qkv [T, 3H]; mid [T, max(I, th)]; patches) and the
  // attention's float scores and probabilities of every head.
  const int64_t activations = T * (6 * H + std::max(I, th) + patch) * elem_bytes;
  const int64_t attention = int64_t{v.n_heads} * T * T * (4 + elem_bytes);
  // The pool holds whole slots of [n_image_tokens, text_hidden] float32 rows, at least one.
  const int64_t slot = int64_t{c.n_image_tokens()} * th * 4;
  const int64_t pool = std::max(slot, pool_bytes / std::max<int64_t>(slot, 1) * slot);
  // Device preprocessing: the decoded image with the plan's tables (1 MiB more at most), the
  // horizontal pass's rows and the resized image, 3 bytes a pixel each.
  const int64_t preprocess = 3 * 3 * kVisionDevicePreprocessPixels + (int64_t{1} << 20);
  constexpr int64_t kContextBytes = int64_t{1} << 30;
  return weights * elem_bytes + activations + attention + pool + preprocess +
         kVisionCublasWorkspaceBytes + kContextBytes;
}

Result<LlavaConfig> parse_llava_config(const json& j) {
  LITELLAMA_ASSIGN_OR_RETURN(ModelConfig text, parse_model_config(j));
  if (text.arch != Architecture::kLlava) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: not a LlavaForConditionalGeneration config");
  }
  LlavaConfig c;
  c.text_hidden_size = text.hidden_size;
  auto v = j.find("vision_config");
  if (v == j.end() || !v->is_object()) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: LLaVA config needs a 'vision_config' object");
  }
  const std::string type = v->value("model_type", std::string("clip_vision_model"));
  if (type != "clip_vision_model") {
    return make_error(StatusCode::kUnsupported,
                      "config.json: vision model type '{}' is not supported (only "
                      "clip_vision_model)",
                      type);
  }
  ClipVisionConfig& vc = c.vision;
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "hidden_size", 1, &vc.hidden_size));
  LITELLAMA_RETURN_IF_ERROR(
      read_int(*v, "vision_config.", "intermediate_size", 1, &vc.intermediate_size));
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "num_hidden_layers", 1, &vc.n_layers));
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "num_attention_heads", 1, &vc.n_heads));
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "num_channels", 1, &vc.n_channels));
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "image_size", 1, &vc.image_size));
  LITELLAMA_RETURN_IF_ERROR(read_int(*v, "vision_config.", "patch_size", 1, &vc.patch_size));
  if (auto eps = v->find("layer_norm_eps"); eps != v->end() && !eps->is_null()) {
    if (!eps->is_number() || !(eps->get<double>() > 0)) {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: 'vision_config.layer_norm_eps' must be positive");
    }
    vc.layer_norm_eps = eps->get<double>();
  }
  if (vc.hidden_size % vc.n_heads != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: vision hidden_size {} is not a multiple of its {} heads",
                      vc.hidden_size, vc.n_heads);
  }
  if (vc.n_channels != 3) {
    return make_error(StatusCode::kUnsupported,
                      "config.json: vision num_channels {} is not supported (only 3)",
                      vc.n_channels);
  }
  if (vc.patch_size > vc.image_size) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: vision patch_size {} exceeds image_size {}", vc.patch_size,
                      vc.image_size);
  }
  if (auto act = v->find("hidden_act"); act != v->end() && act->is_string()) {
    if (act->get<std::string>() != "quick_gelu") {
      return make_error(StatusCode::kUnsupported,
                        "config.json: vision hidden_act '{}' is not supported (only quick_gelu)",
                        act->get<std::string>());
    }
  }

  if (auto f = j.find("vision_feature_layer"); f != j.end() && !f->is_null()) {
    if (!f->is_number_integer()) {
      return make_error(StatusCode::kUnsupported,
                        "config.json: 'vision_feature_layer' must be one integer (lists of "
                        "layers are not supported)");
    }
    c.vision_feature_layer = f->get<int32_t>();
  }
  const int32_t used = c.n_layers_used();
  if (used < 0 || used > vc.n_layers) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: vision_feature_layer {} is outside the {} hidden states",
                      c.vision_feature_layer, vc.n_layers + 1);
  }
  if (auto s = j.find("vision_feature_select_strategy"); s != j.end() && !s->is_null()) {
    const std::string name = s->is_string() ? s->get<std::string>() : "";
    if (name == "default") {
      c.feature_select = VisionFeatureSelect::kDefault;
    } else if (name == "full") {
      c.feature_select = VisionFeatureSelect::kFull;
    } else {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: vision_feature_select_strategy must be 'default' or 'full'");
    }
  }
  if (auto act = j.find("projector_hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "gelu") {
      return make_error(StatusCode::kUnsupported,
                        "config.json: projector_hidden_act must be 'gelu' (exact)");
    }
  }
  if (auto b = j.find("multimodal_projector_bias"); b != j.end() && b->is_boolean()) {
    c.projector_bias = b->get<bool>();
  }
  // transformers calls it image_token_index and maps image_token_id onto it.
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", "image_token_index", 0, &c.image_token_id));
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", "image_token_id", 0, &c.image_token_id));
  if (c.image_token_id >= text.vocab_size) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: image token id {} is outside the text vocabulary of {}",
                      c.image_token_id, text.vocab_size);
  }
  c.image_seq_length = c.n_image_tokens();
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", "image_seq_length", 1, &c.image_seq_length));
  if (c.image_seq_length != c.n_image_tokens()) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: image_seq_length {} but the vision tower gives {} features "
                      "per image",
                      c.image_seq_length, c.n_image_tokens());
  }
  return c;
}

Result<LlavaConfig> parse_llava_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(StatusCode::kInvalidArgument, "config.json: not JSON");
  return parse_llava_config(j);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llava_vision_tensor_specs(
    const LlavaConfig& config, const LlavaTensorNames& n) {
  const ClipVisionConfig& v = config.vision;
  const int64_t h = v.hidden_size, inter = v.intermediate_size, p = v.patch_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs;
  specs.push_back({n.vision("embeddings.class_embedding"), {h}});
  specs.push_back({n.vision("embeddings.patch_embedding.weight"), {h, v.n_channels, p, p}});
  specs.push_back({n.vision("embeddings.position_embedding.weight"), {v.n_positions(), h}});
  specs.push_back({n.vision("pre_layrnorm.weight"), {h}});
  specs.push_back({n.vision("pre_layrnorm.bias"), {h}});
  for (int32_t l = 0; l < v.n_layers; ++l) {
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      specs.push_back({n.layer(l, std::string("self_attn.") + proj + ".weight"), {h, h}});
      specs.push_back({n.layer(l, std::string("self_attn.") + proj + ".bias"), {h}});
    }
    specs.push_back({n.layer(l, "layer_norm1.weight"), {h}});
    specs.push_back({n.layer(l, "layer_norm1.bias"), {h}});
    specs.push_back({n.layer(l, "mlp.fc1.weight"), {inter, h}});
    specs.push_back({n.layer(l, "mlp.fc1.bias"), {inter}});
    specs.push_back({n.layer(l, "mlp.fc2.weight"), {h, inter}});
    specs.push_back({n.layer(l, "mlp.fc2.bias"), {h}});
    specs.push_back({n.layer(l, "layer_norm2.weight"), {h}});
    specs.push_back({n.layer(l, "layer_norm2.bias"), {h}});
  }
  specs.push_back({n.vision("post_layernorm.weight"), {h}});
  specs.push_back({n.vision("post_layernorm.bias"), {h}});
  const int64_t th = config.text_hidden_size;
  specs.push_back({n.projector("linear_1.weight"), {th, h}});
  if (config.projector_bias) specs.push_back({n.projector("linear_1.bias"), {th}});
  specs.push_back({n.projector("linear_2.weight"), {th, th}});
  if (config.projector_bias) specs.push_back({n.projector("linear_2.bias"), {th}});
  return specs;
}

}  // namespace litellama
