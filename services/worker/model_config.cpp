#include "services/worker/model_config.h"

#include <cmath>
#include <optional>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace litellama {

using nlohmann::json;

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kLlava:
      return "LlavaForConditionalGeneration";
  }
  return "?";
}

const char* rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kDefault:
      return "default";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kDynamic:
      return "dynamic";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

namespace {

// Reads config keys with errors that name the key; a missing required key is an error.
class ConfigReader {
 public:
  explicit ConfigReader(const json& j) : j_(j) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return (it != j_.end() && !it->is_null()) ? &*it : nullptr;
  }

  Status get_int(const char* key, int64_t* out) const {
    const json* v = find(key);
    if (!v) return make_error(StatusCode::kInvalidArgument, "config.json: missing key '{}'", key);
    if (!v->is_number_integer()) {
      return make_error(StatusCode::kInvalidArgument, "config.json: '{}' must be an integer", key);
    }
    *out = v->get<int64_t>();
    return Status::ok();
  }

  Status get_int32(const char* key, int32_t* out, bool positive = true) const {
    int64_t v = 0;
    LITELLAMA_RETURN_IF_ERROR(get_int(key, &v));
    if (positive && v <= 0) {
      return make_error(StatusCode::kInvalidArgument, "config.json: '{}' must be positive, got {}",
                        key, v);
    }
    if (v > INT32_MAX) {
      return make_error(StatusCode::kInvalidArgument, "config.json: '{}' is too large ({})", key,
                        v);
    }
    *out = static_cast<int32_t>(v);
    return Status::ok();
  }

  Status get_double_or(const char* key, double fallback, double* out) const {
    return get_or(key, fallback, out);
  }
  Status get_bool_or(const char* key, bool fallback, bool* out) const {
    return get_or(key, fallback, out);
  }

 private:
  // An optional key: a number for double, true or false for bool; `fallback` when absent.
  template <typename T>
  Status get_or(const char* key, T fallback, T* out) const {
    constexpr bool kBool = std::is_same_v<T, bool>;
    const json* v = find(key);
    if (!v) {
      *out = fallback;
      return Status::ok();
    }
    if (kBool ? !v->is_boolean() : !v->is_number()) {
      return make_error(StatusCode::kInvalidArgument, "config.json: '{}' must be {}", key,
                        kBool ? "true or false" : "a number");
    }
    *out = v->get<T>();
    return Status::ok();
  }

  const json& j_;
};

// LlamaConfig's defaults, which LLaVA-1.5's text_config leaves implicit.
const json& llama_defaults() {
  static const json kDefaults = {
      {"hidden_size", 4096},
      {"intermediate_size", 11008},
      {"num_hidden_layers", 32},
      {"num_attention_heads", 32},
      {"max_position_embeddings", 2048},
      {"rms_norm_eps", 1e-6},
      {"vocab_size", 32000},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", false},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  return kDefaults;
}

Status parse_rope(const json& j, const ConfigReader& reader, ModelConfig* config) {
  RopeConfig& rope = config->rope;
  // transformers 5 writes "rope_parameters" (theta inside); older configs "rope_theta" and
  // "rope_scaling". Both are accepted.
  const json* scaling = nullptr;
  auto params = j.find("rope_parameters");
  if (params != j.end() && params->is_object()) {
    scaling = &*params;
    LITELLAMA_RETURN_IF_ERROR(reader.get_double_or("rope_theta", 10000.0, &rope.theta));
    if (auto t = params->find("rope_theta"); t != params->end() && t->is_number()) {
      rope.theta = t->get<double>();
    }
  } else {
    LITELLAMA_RETURN_IF_ERROR(reader.get_double_or("rope_theta", 10000.0, &rope.theta));
    auto s = j.find("rope_scaling");
    if (s != j.end() && !s->is_null()) {
      if (!s->is_object()) {
        return make_error(StatusCode::kInvalidArgument,
                          "config.json: 'rope_scaling' must be an object or null");
      }
      scaling = &*s;
    }
  }
  if (!(rope.theta > 0)) {
    return make_error(StatusCode::kInvalidArgument, "config.json: rope_theta must be positive");
  }
  rope.original_max_position_embeddings = config->max_position_embeddings;
  if (!scaling) return Status::ok();

  std::string type = "default";
  if (auto t = scaling->find("rope_type"); t != scaling->end() && t->is_string()) {
    type = t->get<std::string>();
  } else if (auto t2 = scaling->find("type"); t2 != scaling->end() && t2->is_string()) {
    type = t2->get<std::string>();
  }
  auto num = [&](const char* key, double fallback) {
    auto it = scaling->find(key);
    return (it != scaling->end() && it->is_number()) ? it->get<double>() : fallback;
  };
  rope.factor = num("factor", 1.0);
  rope.original_max_position_embeddings = static_cast<int64_t>(num(
      "original_max_position_embeddings", static_cast<double>(config->max_position_embeddings)));
  if (type == "default") {
    rope.type = RopeScalingType::kDefault;
    return Status::ok();
  }
  if (type == "linear") {
    rope.type = RopeScalingType::kLinear;
  } else if (type == "dynamic") {
    rope.type = RopeScalingType::kDynamic;
  } else if (type == "llama3") {
    rope.type = RopeScalingType::kLlama3;
    rope.low_freq_factor = num("low_freq_factor", 1.0);
    rope.high_freq_factor = num("high_freq_factor", 4.0);
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return make_error(
          StatusCode::kInvalidArgument,
          "config.json: llama3 rope scaling needs high_freq_factor > low_freq_factor");
    }
  } else if (type == "yarn") {
    rope.type = RopeScalingType::kYarn;
    rope.beta_fast = num("beta_fast", 32.0);
    rope.beta_slow = num("beta_slow", 1.0);
    rope.mscale = num("mscale", 0.0);
    rope.mscale_all_dim = num("mscale_all_dim", 0.0);
    rope.attention_factor = num("attention_factor", 0.0);
    if (auto t = scaling->find("truncate"); t != scaling->end() && t->is_boolean()) {
      rope.truncate = t->get<bool>();
    }
  } else {
    return make_error(StatusCode::kUnsupported,
                      "config.json: rope scaling type '{}' is not supported (supported: default, "
                      "linear, dynamic, llama3, yarn)",
                      type);
  }
  if (!(rope.factor > 0)) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: rope scaling factor must be positive");
  }
  if (rope.original_max_position_embeddings <= 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: original_max_position_embeddings must be positive");
  }
  return Status::ok();
}

Status parse_token_ids(const json& j, ModelConfig* config) {
  if (auto b = j.find("bos_token_id"); b != j.end() && b->is_number_integer()) {
    config->bos_token_id = b->get<int32_t>();
  }
  auto e = j.find("eos_token_id");
  if (e == j.end() || e->is_null()) return Status::ok();
  if (e->is_number_integer()) {
    config->eos_token_ids.push_back(e->get<int32_t>());
  } else if (e->is_array()) {
    for (const auto& v : *e) {
      if (!v.is_number_integer()) {
        return make_error(StatusCode::kInvalidArgument,
                          "config.json: 'eos_token_id' must be an integer or a list of integers");
      }
      config->eos_token_ids.push_back(v.get<int32_t>());
    }
  } else {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: 'eos_token_id' must be an integer or a list of integers");
  }
  return Status::ok();
}

// Parses the decoder ("text") part of a config: the top level, or LLaVA's text_config merged
// over LlamaConfig's defaults.
Status parse_text_config(const json& j, ModelConfig* config) {
  ConfigReader reader(j);
  LITELLAMA_RETURN_IF_ERROR(reader.get_int32("hidden_size", &config->hidden_size));
  LITELLAMA_RETURN_IF_ERROR(reader.get_int32("intermediate_size", &config->intermediate_size));
  LITELLAMA_RETURN_IF_ERROR(reader.get_int32("num_hidden_layers", &config->n_layers));
  LITELLAMA_RETURN_IF_ERROR(reader.get_int32("num_attention_heads", &config->n_heads));
  LITELLAMA_RETURN_IF_ERROR(reader.get_int32("vocab_size", &config->vocab_size));
  if (reader.find("num_key_value_heads")) {
    LITELLAMA_RETURN_IF_ERROR(reader.get_int32("num_key_value_heads", &config->n_kv_heads));
  } else {
    config->n_kv_heads = config->n_heads;
  }
  if (reader.find("head_dim")) {
    LITELLAMA_RETURN_IF_ERROR(reader.get_int32("head_dim", &config->head_dim));
  } else {
    if (config->hidden_size % config->n_heads != 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: hidden_size {} is not a multiple of num_attention_heads {}",
                        config->hidden_size, config->n_heads);
    }
    config->head_dim = config->hidden_size / config->n_heads;
  }
  if (config->n_heads % config->n_kv_heads != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: num_attention_heads {} is not a multiple of "
                      "num_key_value_heads {}",
                      config->n_heads, config->n_kv_heads);
  }
  if (config->head_dim % 2 != 0) {
    return make_error(StatusCode::kInvalidArgument, "config.json: head_dim {} must be even",
                      config->head_dim);
  }
  LITELLAMA_RETURN_IF_ERROR(
      reader.get_int("max_position_embeddings", &config->max_position_embeddings));
  if (config->max_position_embeddings <= 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "config.json: 'max_position_embeddings' must be positive");
  }
  LITELLAMA_RETURN_IF_ERROR(reader.get_double_or("rms_norm_eps", 1e-6, &config->rms_norm_eps));
  LITELLAMA_RETURN_IF_ERROR(
      reader.get_bool_or("tie_word_embeddings", false, &config->tie_word_embeddings));
  bool attention_bias = false;
  LITELLAMA_RETURN_IF_ERROR(reader.get_bool_or("attention_bias", false, &attention_bias));
  config->qkv_bias = attention_bias;

  for (const char* key : {"torch_dtype", "dtype"}) {
    const json* d = reader.find(key);
    if (d && d->is_string()) {
      auto dt = dtype_from_torch_name(d->get<std::string>());
      if (!dt) {
        return make_error(StatusCode::kUnsupported, "config.json: {} '{}' is not supported", key,
                          d->get<std::string>());
      }
      config->torch_dtype = *dt;
      break;
    }
  }
  if (const json* act = reader.find("hidden_act"); act && act->is_string()) {
    const auto name = act->get<std::string>();
    if (name != "silu" && name != "swish") {
      return make_error(StatusCode::kUnsupported,
                        "config.json: hidden_act '{}' is not supported (only silu)", name);
    }
  }
  if (const json* mlp_bias = reader.find("mlp_bias");
      mlp_bias && mlp_bias->is_boolean() && mlp_bias->get<bool>()) {
    return make_error(StatusCode::kUnsupported, "config.json: mlp_bias is not supported");
  }
  LITELLAMA_RETURN_IF_ERROR(parse_rope(j, reader, config));
  return parse_token_ids(j, config);
}

}  // namespace

Result<ModelConfig> parse_model_config(const json& j) {
  if (!j.is_object()) {
    return make_error(StatusCode::kInvalidArgument, "config.json: top level must be an object");
  }
  ModelConfig config;
  auto archs = j.find("architectures");
  if (archs != j.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: 'architectures' must be a list naming the model class");
    }
    config.arch_name = (*archs)[0].get<std::string>();
  } else {
    // As AutoModelForCausalLM: without "architectures", the class follows from "model_type".
    auto type = j.find("model_type");
    if (type == j.end() || !type->is_string()) {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: neither 'architectures' nor 'model_type' names the model");
    }
    const std::string t = type->get<std::string>();
    if (t == "llama") {
      config.arch_name = "LlamaForCausalLM";
    } else if (t == "mistral") {
      config.arch_name = "MistralForCausalLM";
    } else if (t == "qwen2") {
      config.arch_name = "Qwen2ForCausalLM";
    } else if (t == "qwen3") {
      config.arch_name = "Qwen3ForCausalLM";
    } else if (t == "llava") {
      config.arch_name = "LlavaForConditionalGeneration";
    } else {
      return make_error(StatusCode::kUnsupported,
                        "config.json: model_type '{}' is not supported (supported: llama, mistral, "
                        "qwen2, qwen3, llava)",
                        t);
    }
  }
  const std::string& name = config.arch_name;
  std::optional<Architecture> arch;
  for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2,
                         Architecture::kQwen3, Architecture::kLlava}) {
    if (name == architecture_name(a)) arch = a;
  }
  if (arch) {
    config.arch = *arch;
  } else {
    return make_error(StatusCode::kUnsupported,
                      "config.json: architecture '{}' is not supported (supported: "
                      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                      "LlavaForConditionalGeneration)",
                      name);
  }

  if (config.arch == Architecture::kLlava) {
    auto text = j.find("text_config");
    if (text == j.end() || !text->is_object()) {
      return make_error(StatusCode::kInvalidArgument,
                        "config.json: LLaVA config needs a 'text_config' object");
    }
    std::string text_type = text->value("model_type", std::string("llama"));
    if (text_type != "llama" && text_type != "mistral") {
      return make_error(StatusCode::kUnsupported,
                        "config.json: LLaVA text model type '{}' is not supported", text_type);
    }
    json merged = llama_defaults();
    merged.update(*text);
    LITELLAMA_RETURN_IF_ERROR(parse_text_config(merged, &config));
    if (config.eos_token_ids.empty()) LITELLAMA_RETURN_IF_ERROR(parse_token_ids(j, &config));
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (auto d = j.find(key); d != j.end() && d->is_string()) {
        if (auto dt = dtype_from_torch_name(d->get<std::string>())) config.torch_dtype = *dt;
      }
    }
    if (auto tie = j.find("tie_word_embeddings"); tie != j.end() && tie->is_boolean()) {
      config.tie_word_embeddings = tie->get<bool>();
    }
    LITELLAMA_ASSIGN_OR_RETURN(config.quant, parse_quant_config(j));
    return config;
  }

  LITELLAMA_RETURN_IF_ERROR(parse_text_config(j, &config));
  switch (config.arch) {
    case Architecture::kQwen2:
      config.qkv_bias = true;
      break;
    case Architecture::kQwen3:
      config.qk_norm = true;
      break;
    case Architecture::kMistral: {
      auto sw = j.find("sliding_window");
      if (sw != j.end() && sw->is_number_integer() &&
          sw->get<int64_t>() < config.max_position_embeddings) {
        return make_error(StatusCode::kUnsupported,
                          "config.json: Mistral sliding_window {} below max_position_embeddings "
                          "is not supported",
                          sw->get<int64_t>());
      }
      break;
    }
    case Architecture::kLlama:
    case Architecture::kLlava:
      break;
  }
  if (config.arch == Architecture::kQwen2) {
    auto sw = j.find("use_sliding_window");
    if (sw != j.end() && sw->is_boolean() && sw->get<bool>()) {
      return make_error(StatusCode::kUnsupported,
                        "config.json: Qwen2 use_sliding_window is not supported");
    }
  }
  LITELLAMA_ASSIGN_OR_RETURN(config.quant, parse_quant_config(j));
  return config;
}

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(StatusCode::kInvalidArgument, "config.json: not valid JSON");
  }
  return parse_model_config(j);
}

}  // namespace litellama
