#include "services/worker/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "services/worker/quantized_linear.h"
#include "services/worker/safetensors.h"

namespace litellama {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  convert_to_f32(out.data(), data, dtype, out.size());
  return out;
}

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return make_error(StatusCode::kNotFound, "model directory '{}' does not exist", dir);
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path, ec)) {
    return make_error(StatusCode::kNotFound, "'{}' has no config.json", dir);
  }
  LITELLAMA_ASSIGN_OR_RETURN(std::string config_text, read_text_file(config_path));
  auto config = parse_model_config(config_text);
  if (!config.is_ok()) return Status(config.status().code(), config.status().message());
  ckpt.config_ = std::move(config).value();

  // Which files hold the weights: a sharded index, or a single model.safetensors.
  std::vector<std::string> files;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path, ec)) {
    LITELLAMA_ASSIGN_OR_RETURN(std::string index_text, read_text_file(index_path.string()));
    json index = json::parse(index_text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return make_error(StatusCode::kInvalidArgument,
                        "'{}': not valid JSON with a 'weight_map' object", index_path.string());
    }
    std::set<std::string> shard_set;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return make_error(StatusCode::kInvalidArgument,
                          "'{}': weight_map entry '{}' is not a "
                          "file name",
                          index_path.string(), it.key());
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
        return make_error(StatusCode::kInvalidArgument,
                          "'{}': shard name '{}' is not a plain "
                          "file name",
                          index_path.string(), shard);
      }
      weight_map[it.key()] = shard;
      shard_set.insert(shard);
    }
    files.assign(shard_set.begin(), shard_set.end());
  } else if (fs::exists(single_path, ec)) {
    files.push_back("model.safetensors");
  } else {
    return make_error(StatusCode::kNotFound,
                      "'{}' has neither model.safetensors nor model.safetensors.index.json", dir);
  }

  for (const auto& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    auto mapped = MappedFile::open(path);
    if (!mapped.is_ok()) return mapped.status();
    auto file = std::make_shared<MappedFile>(std::move(mapped).value());
    LITELLAMA_ASSIGN_OR_RETURN(auto entries, parse_safetensors(*file));
    for (auto& e : entries) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(e.name);
        if (w == weight_map.end() || w->second != name) continue;  // index says it lives elsewhere
      }
      if (ckpt.tensors_.count(e.name)) {
        return make_error(StatusCode::kInvalidArgument, "tensor '{}' appears in two files", e.name);
      }
      TensorView view;
      view.name = e.name;
      view.dtype = e.dtype;
      view.shape = std::move(e.shape);
      view.data = file->data() + e.offset_bytes;
      view.size_bytes = e.size_bytes;
      view.shard = static_cast<int32_t>(ckpt.files_.size());
      ckpt.tensors_.emplace(view.name, std::move(view));
    }
    ckpt.files_.push_back(std::move(file));
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (!ckpt.tensors_.count(tensor)) {
      return make_error(StatusCode::kDataLoss,
                        "index lists tensor '{}' in '{}' but that file "
                        "does not contain it",
                        tensor, shard);
    }
  }

  // LLaVA nests the text model; both published layouts are recognised.
  if (ckpt.config_.arch == Architecture::kLlava) {
    if (ckpt.has("language_model.model.embed_tokens.weight")) {
      ckpt.config_.text_prefix = "language_model.model.";
      ckpt.config_.lm_head_name = "language_model.lm_head.weight";
    } else {
      ckpt.config_.text_prefix = "model.language_model.";
      ckpt.config_.lm_head_name = "lm_head.weight";
    }
    auto llava = parse_llava_config(config_text);
    if (!llava.is_ok()) return llava.status();
    ckpt.llava_ = std::move(llava).value();
    if (!ckpt.has(ckpt.llava_names_.vision("embeddings.class_embedding"))) {
      ckpt.llava_names_.vision_prefix = "model.vision_tower.";
    }
    if (!ckpt.has(ckpt.llava_names_.projector("linear_1.weight"))) {
      ckpt.llava_names_.projector_prefix = "model.multi_modal_projector.";
    }
  }
  LITELLAMA_RETURN_IF_ERROR(ckpt.validate());
  return ckpt;
}

Result<TensorView> Checkpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return make_error(StatusCode::kNotFound, "checkpoint has no tensor '{}'", name);
  }
  if (read_observer_) read_observer_(it->second);
  return it->second;
}

std::vector<int64_t> Checkpoint::shard_bytes() const {
  std::vector<int64_t> bytes(files_.size(), 0);
  for (const auto& [name, view] : tensors_) {
    bytes[static_cast<size_t>(view.shard)] += static_cast<int64_t>(view.size_bytes);
  }
  return bytes;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

LayerTensorNames Checkpoint::layer_names(int32_t layer) const {
  const std::string p = config_.text_prefix + "layers." + std::to_string(layer) + ".";
  LayerTensorNames n;
  n.input_norm = p + "input_layernorm.weight";
  n.q = p + "self_attn.q_proj.weight";
  n.k = p + "self_attn.k_proj.weight";
  n.v = p + "self_attn.v_proj.weight";
  n.o = p + "self_attn.o_proj.weight";
  n.q_bias = p + "self_attn.q_proj.bias";
  n.k_bias = p + "self_attn.k_proj.bias";
  n.v_bias = p + "self_attn.v_proj.bias";
  n.q_norm = p + "self_attn.q_norm.weight";
  n.k_norm = p + "self_attn.k_norm.weight";
  n.post_attention_norm = p + "post_attention_layernorm.weight";
  n.gate = p + "mlp.gate_proj.weight";
  n.up = p + "mlp.up_proj.weight";
  n.down = p + "mlp.down_proj.weight";
  return n;
}

std::string Checkpoint::lm_head_name() const {
  if (config_.tie_word_embeddings) return embed_name();
  return config_.lm_head_name;
}

namespace {

// "model.layers.3.mlp.down_proj.weight" -> "model.layers.3.mlp.down_proj"
std::string module_of(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() > kSuffix.size() &&
      weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    return weight_name.substr(0, weight_name.size() - kSuffix.size());
  }
  return weight_name;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::pair<int64_t, int64_t>> Checkpoint::linear_shape(const std::string& weight_name) const {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, q_dim = int64_t{c.n_heads} * c.head_dim,
                kv_dim = int64_t{c.n_kv_heads} * c.head_dim, inter = c.intermediate_size;
  const std::string m = module_of(weight_name);
  if (ends_with(m, "self_attn.q_proj")) return std::pair{q_dim, h};
  if (ends_with(m, "self_attn.k_proj") || ends_with(m, "self_attn.v_proj")) {
    return std::pair{kv_dim, h};
  }
  if (ends_with(m, "self_attn.o_proj")) return std::pair{h, q_dim};
  if (ends_with(m, "mlp.gate_proj") || ends_with(m, "mlp.up_proj")) return std::pair{inter, h};
  if (ends_with(m, "mlp.down_proj")) return std::pair{h, inter};
  return make_error(StatusCode::kInvalidArgument, "'{}' is not a decoder layer projection",
                    weight_name);
}

bool Checkpoint::is_quantized(const std::string& weight_name) const {
  return module_is_quantized(config_.quant, module_of(weight_name));
}

Result<std::vector<float>> Checkpoint::linear_f32(const std::string& weight_name) const {
  LITELLAMA_ASSIGN_OR_RETURN(auto shape, linear_shape(weight_name));
  const QuantConfig dense;
  const QuantConfig& q = is_quantized(weight_name) ? config_.quant : dense;
  return dequantize_linear(q, module_of(weight_name), shape.first, shape.second,
                           [this](const std::string& name) { return tensor(name); });
}

Result<Int4Linear> Checkpoint::int4_linear(const std::string& weight_name) const {
  LITELLAMA_ASSIGN_OR_RETURN(auto shape, linear_shape(weight_name));
  if (!is_quantized(weight_name)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is stored dense", weight_name);
  }
  return unpack_int4_linear(config_.quant, module_of(weight_name), shape.first, shape.second,
                            [this](const std::string& name) { return tensor(name); });
}

Result<Fp8Linear> Checkpoint::fp8_linear(const std::string& weight_name) const {
  LITELLAMA_ASSIGN_OR_RETURN(auto shape, linear_shape(weight_name));
  if (!is_quantized(weight_name)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is stored dense", weight_name);
  }
  return fp8_linear_parts(config_.quant, module_of(weight_name), shape.first, shape.second,
                          [this](const std::string& name) { return tensor(name); });
}

size_t Checkpoint::size_bytes() const {
  size_t total = 0;
  for (const auto& [name, view] : tensors_) total += view.size_bytes;
  return total;
}

Status Checkpoint::validate() const {
  const ModelConfig& c = config_;
  auto expect = [&](const std::string& name, std::vector<int64_t> shape) -> Status {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return make_error(StatusCode::kNotFound, "'{}': missing tensor '{}' (expected shape {})",
                        dir_, name, shape_string(shape));
    }
    const TensorView& t = it->second;
    if (t.shape != shape) {
      return make_error(StatusCode::kInvalidArgument,
                        "'{}': tensor '{}' has shape {} but config.json implies {}", dir_, name,
                        shape_string(t.shape), shape_string(shape));
    }
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
      return make_error(StatusCode::kUnsupported,
                        "'{}': tensor '{}' is {}; weights must be F32, BF16 or F16", dir_, name,
                        dtype_safetensors_name(t.dtype));
    }
    return Status::ok();
  };
  // A projection: its dense weight, or each tensor of its quantized layout.
  auto expect_linear = [&](const std::string& name) -> Status {
    LITELLAMA_ASSIGN_OR_RETURN(auto shape, linear_shape(name));
    if (!is_quantized(name)) return expect(name, {shape.first, shape.second});
    LITELLAMA_ASSIGN_OR_RETURN(
        auto specs, quantized_linear_specs(c.quant, module_of(name), shape.first, shape.second));
    for (const QuantTensorSpec& spec : specs) {
      auto it = tensors_.find(spec.name);
      if (it == tensors_.end()) {
        if (spec.optional) continue;
        return make_error(
            StatusCode::kNotFound, "'{}': missing tensor '{}' of the {} layout (expected shape {})",
            dir_, spec.name, quant_method_name(c.quant.method), shape_string(spec.shapes.front()));
      }
      const TensorView& t = it->second;
      if (std::find(spec.shapes.begin(), spec.shapes.end(), t.shape) == spec.shapes.end()) {
        return make_error(StatusCode::kInvalidArgument,
                          "'{}': tensor '{}' has shape {} but the {} layout of [{}, {}] implies {}",
                          dir_, spec.name, shape_string(t.shape), quant_method_name(c.quant.method),
                          shape.first, shape.second, shape_string(spec.shapes.front()));
      }
      if (std::find(spec.dtypes.begin(), spec.dtypes.end(), t.dtype) == spec.dtypes.end()) {
        std::string allowed;
        for (DType d : spec.dtypes)
          allowed += (allowed.empty() ? "" : ", ") + std::string(dtype_safetensors_name(d));
        return make_error(StatusCode::kInvalidArgument,
                          "'{}': tensor '{}' is {}; the {} layout stores it as {}", dir_, spec.name,
                          dtype_safetensors_name(t.dtype), quant_method_name(c.quant.method),
                          allowed);
      }
    }
    return Status::ok();
  };
  const int64_t h = c.hidden_size, q_dim = int64_t{c.n_heads} * c.head_dim,
                kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  LITELLAMA_RETURN_IF_ERROR(expect(embed_name(), {c.vocab_size, h}));
  LITELLAMA_RETURN_IF_ERROR(expect(final_norm_name(), {h}));
  if (!c.tie_word_embeddings) LITELLAMA_RETURN_IF_ERROR(expect(c.lm_head_name, {c.vocab_size, h}));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerTensorNames n = layer_names(l);
    LITELLAMA_RETURN_IF_ERROR(expect(n.input_norm, {h}));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.q));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.k));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.v));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.o));
    if (c.qkv_bias) {
      LITELLAMA_RETURN_IF_ERROR(expect(n.q_bias, {q_dim}));
      LITELLAMA_RETURN_IF_ERROR(expect(n.k_bias, {kv_dim}));
      LITELLAMA_RETURN_IF_ERROR(expect(n.v_bias, {kv_dim}));
    }
    if (c.qk_norm) {
      LITELLAMA_RETURN_IF_ERROR(expect(n.q_norm, {c.head_dim}));
      LITELLAMA_RETURN_IF_ERROR(expect(n.k_norm, {c.head_dim}));
    }
    LITELLAMA_RETURN_IF_ERROR(expect(n.post_attention_norm, {h}));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.gate));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.up));
    LITELLAMA_RETURN_IF_ERROR(expect_linear(n.down));
  }
  if (llava_) {
    // post_layernorm is published but never used by LLaVA's features; it is not required.
    for (const auto& [name, shape] : llava_vision_tensor_specs(*llava_, llava_names_)) {
      if (name.find("post_layernorm") != std::string::npos) continue;
      LITELLAMA_RETURN_IF_ERROR(expect(name, shape));
    }
  }
  return Status::ok();
}

}  // namespace litellama
