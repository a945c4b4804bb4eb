#include "services/worker/quant_config.h"

#include <cctype>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace litellama {

using nlohmann::json;

const char* quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kAwq:
      return "awq";
    case QuantMethod::kGptq:
      return "gptq";
    case QuantMethod::kFp8:
      return "fp8";
    case QuantMethod::kInt8:
      return "int8";
  }
  return "?";
}

namespace {

Status field_error(const std::string& field, const std::string& what) {
  return make_error(StatusCode::kUnsupported, "config.json: quantization_config.{}: {}", field,
                    what);
}

// The first of `keys` present and not null, or nullptr.
const json* first_of(const json& j, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

Status read_int(const json& j, const std::string& prefix, std::initializer_list<const char*> keys,
                int32_t fallback, int32_t* out) {
  const json* v = first_of(j, keys);
  if (!v) {
    *out = fallback;
    return Status::ok();
  }
  if (!v->is_number_integer()) return field_error(prefix + *keys.begin(), "must be an integer");
  *out = static_cast<int32_t>(v->get<int64_t>());
  return Status::ok();
}

Status read_bool(const json& j, const std::string& prefix, const char* key, bool fallback,
                 bool* out) {
  const json* v = first_of(j, {key});
  if (!v) {
    *out = fallback;
    return Status::ok();
  }
  if (!v->is_boolean()) return field_error(prefix + key, "must be true or false");
  *out = v->get<bool>();
  return Status::ok();
}

Status read_strings(const json& j, const char* key, std::vector<std::string>* out) {
  const json* v = first_of(j, {key});
  if (!v) return Status::ok();
  if (!v->is_array()) return field_error(key, "must be a list of module names");
  for (const auto& e : *v) {
    if (!e.is_string()) return field_error(key, "must be a list of module names");
    out->push_back(e.get<std::string>());
  }
  return Status::ok();
}

Status read_group_size(const json& j, QuantConfig* q) {
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", {"group_size", "q_group_size"}, -1, &q->group_size));
  if (q->group_size == 0 || q->group_size < -1) {
    return field_error("group_size", "must be positive or -1 (one group over all input rows)");
  }
  return Status::ok();
}

Status parse_awq(const json& j, QuantConfig* q) {
  q->method = QuantMethod::kAwq;
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", {"bits", "w_bit"}, 4, &q->bits));
  if (q->bits != 4)
    return field_error("bits", fmt::format("{}-bit AWQ is not supported (4)", q->bits));
  LITELLAMA_RETURN_IF_ERROR(read_group_size(j, q));
  if (const json* v = first_of(j, {"version"})) {
    std::string version = v->is_string() ? v->get<std::string>() : "";
    for (char& c : version) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (version != "gemm") {
      return field_error("version",
                         fmt::format("'{}' is not supported: only AutoAWQ's GEMM layout ('gemm')",
                                     v->is_string() ? v->get<std::string>() : v->dump()));
    }
  }
  bool zero_point = true;
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "", "zero_point", true, &zero_point));
  if (!zero_point) return field_error("zero_point", "false (symmetric AWQ) is not supported");
  q->symmetric = false;
  return read_strings(j, "modules_to_not_convert", &q->not_converted);
}

Status parse_gptq(const json& j, QuantConfig* q) {
  q->method = QuantMethod::kGptq;
  LITELLAMA_RETURN_IF_ERROR(read_int(j, "", {"bits"}, 4, &q->bits));
  if (q->bits != 4 && q->bits != 8) {
    return field_error("bits", fmt::format("{}-bit GPTQ is not supported (4 or 8)", q->bits));
  }
  LITELLAMA_RETURN_IF_ERROR(read_group_size(j, q));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "", "sym", true, &q->symmetric));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "", "desc_act", false, &q->act_order));
  bool lm_head = false;
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "", "lm_head", false, &lm_head));
  if (lm_head) return field_error("lm_head", "a quantized lm_head is not supported");
  // GPTQModel's per-module overrides and transformers' list of modules quantized inside a block
  // change which tensors exist; the loader expects every projection quantized alike.
  for (const char* key : {"dynamic", "modules_in_block_to_quantize"}) {
    if (first_of(j, {key})) return field_error(key, "per-module choices are not supported");
  }
  if (const json* v = first_of(j, {"checkpoint_format"})) {
    std::string format = v->is_string() ? v->get<std::string>() : v->dump();
    for (char& ch : format) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (format == "gptq") {
      q->zeros_minus_one = true;
    } else if (format == "gptq_v2") {
      q->zeros_minus_one = false;
    } else {
      return field_error("checkpoint_format",
                         fmt::format("'{}' is not supported ('gptq' or 'gptq_v2')", format));
    }
  }
  return read_strings(j, "modules_to_not_convert", &q->not_converted);
}

// One compressed-tensors quantization args object ("weights" or "input_activations").
struct CtArgs {
  int32_t num_bits = 0;
  std::string type, strategy;
  bool symmetric = true, dynamic = false;
};

Status parse_ct_args(const json& j, const std::string& field, CtArgs* a) {
  if (!j.is_object()) return field_error(field, "must be an object");
  LITELLAMA_RETURN_IF_ERROR(read_int(j, field + ".", {"num_bits"}, 0, &a->num_bits));
  const json* type = first_of(j, {"type"});
  const json* strategy = first_of(j, {"strategy"});
  if (!type || !type->is_string()) return field_error(field + ".type", "must be 'float' or 'int'");
  if (!strategy || !strategy->is_string()) return field_error(field + ".strategy", "is missing");
  a->type = type->get<std::string>();
  a->strategy = strategy->get<std::string>();
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, field + ".", "symmetric", true, &a->symmetric));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, field + ".", "dynamic", false, &a->dynamic));
  if (a->num_bits != 8) {
    return field_error(field + ".num_bits", fmt::format("{} is not supported (8)", a->num_bits));
  }
  if (a->type != "float" && a->type != "int") {
    return field_error(field + ".type", fmt::format("'{}' is not supported", a->type));
  }
  if (!a->symmetric) return field_error(field + ".symmetric", "false is not supported");
  return Status::ok();
}

Status parse_compressed_tensors(const json& j, QuantConfig* q) {
  std::string format = "dense";
  if (const json* f = first_of(j, {"format"})) format = f->is_string() ? f->get<std::string>() : "";
  if (format == "dense") return Status::ok();  // weights stored unquantized
  if (format != "float-quantized" && format != "int-quantized" && format != "naive-quantized") {
    return field_error("format", fmt::format("'{}' is not supported (float-quantized, "
                                             "int-quantized or naive-quantized)",
                                             format));
  }
  const json* groups = first_of(j, {"config_groups"});
  if (!groups || !groups->is_object() || groups->size() != 1) {
    return field_error("config_groups", "exactly one quantization group is supported");
  }
  const std::string group_name = groups->begin().key();
  const json& g = groups->begin().value();
  const std::string prefix = "config_groups." + group_name + ".";
  if (!g.is_object()) return field_error(prefix, "must be an object");
  const json* targets = first_of(g, {"targets"});
  if (!targets || !targets->is_array() || targets->size() != 1 ||
      *targets != json::array({"Linear"})) {
    return field_error(prefix + "targets", "only [\"Linear\"] is supported");
  }
  const json* weights = first_of(g, {"weights"});
  if (!weights) return field_error(prefix + "weights", "is missing");
  CtArgs w;
  LITELLAMA_RETURN_IF_ERROR(parse_ct_args(*weights, prefix + "weights", &w));
  if (w.dynamic) return field_error(prefix + "weights.dynamic", "true is not supported");
  q->method = w.type == "float" ? QuantMethod::kFp8 : QuantMethod::kInt8;
  q->bits = 8;
  if (w.strategy == "tensor") {
    q->weight_scale = ScaleStrategy::kTensor;
  } else if (w.strategy == "channel") {
    q->weight_scale = ScaleStrategy::kChannel;
  } else {
    return field_error(prefix + "weights.strategy",
                       fmt::format("'{}' is not supported ('tensor' or 'channel')", w.strategy));
  }
  if (const json* in = first_of(g, {"input_activations"})) {
    CtArgs a;
    LITELLAMA_RETURN_IF_ERROR(parse_ct_args(*in, prefix + "input_activations", &a));
    if (a.type != w.type) {
      return field_error(prefix + "input_activations.type",
                         fmt::format("'{}' differs from the weights' '{}'", a.type, w.type));
    }
    const bool token = a.strategy == "token" && a.dynamic;
    const bool tensor = a.strategy == "tensor";
    if (!token && !tensor) {
      return field_error(prefix + "input_activations.strategy",
                         fmt::format("'{}' with dynamic {} is not supported (dynamic 'token' or "
                                     "'tensor')",
                                     a.strategy, a.dynamic));
    }
    q->activations_quantized = true;
    q->input_dynamic = a.dynamic;
  }
  if (first_of(g, {"output_activations"})) {
    return field_error(prefix + "output_activations", "quantized outputs are not supported");
  }
  LITELLAMA_RETURN_IF_ERROR(read_strings(j, "ignore", &q->ignore));
  for (const std::string& entry : q->ignore) {
    if (entry.rfind("re:", 0) != 0) continue;
    try {
      (void)std::regex(entry.substr(3));
    } catch (const std::regex_error&) {
      return field_error("ignore", fmt::format("'{}' is not a regular expression this engine "
                                               "reads (ECMAScript syntax)",
                                               entry));
    }
  }
  return Status::ok();
}

}  // namespace

Result<QuantConfig> parse_quant_config(const json& config_json) {
  QuantConfig q;
  auto it = config_json.find("quantization_config");
  if (it == config_json.end() || it->is_null()) it = config_json.find("compression_config");
  if (it == config_json.end() || it->is_null()) return q;
  const json& j = *it;
  if (!j.is_object()) return field_error("", "must be an object");
  const json* method = first_of(j, {"quant_method"});
  if (!method || !method->is_string()) {
    return field_error("quant_method", "is missing (awq, gptq or compressed-tensors)");
  }
  const std::string name = method->get<std::string>();
  if (name == "awq") {
    LITELLAMA_RETURN_IF_ERROR(parse_awq(j, &q));
  } else if (name == "gptq") {
    LITELLAMA_RETURN_IF_ERROR(parse_gptq(j, &q));
  } else if (name == "compressed-tensors") {
    LITELLAMA_RETURN_IF_ERROR(parse_compressed_tensors(j, &q));
  } else {
    return field_error(
        "quant_method",
        fmt::format("'{}' is not supported (awq, gptq or compressed-tensors)", name));
  }
  return q;
}

bool module_is_quantized(const QuantConfig& config, const std::string& module) {
  if (config.method == QuantMethod::kNone) return false;
  for (const std::string& entry : config.not_converted) {
    if (module.find(entry) != std::string::npos) return false;
  }
  for (const std::string& entry : config.ignore) {
    if (entry.rfind("re:", 0) == 0) {
      // As Python's re.match: anchored at the start of the name, not at its end.
      // parse_quant_config checked that every expression compiles.
      if (std::regex_search(module, std::regex(entry.substr(3)),
                            std::regex_constants::match_continuous)) {
        return false;
      }
    } else if (module == entry) {
      return false;
    }
  }
  return true;
}

}  // namespace litellama
