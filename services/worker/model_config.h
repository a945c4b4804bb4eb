// ModelConfig: what the engine needs from a Hugging Face config.json, validated once at load so
// that no backend ever computes with a shape or variant it does not support.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/status.h"
#include "services/worker/quant_config.h"

namespace litellama {

enum class Architecture {
  kLlama,    // LlamaForCausalLM (Llama 2, 3, 3.1, 3.2)
  kMistral,  // MistralForCausalLM without sliding window: the Llama graph
  kQwen2,    // Qwen2ForCausalLM: q/k/v bias
  kQwen3,    // Qwen3ForCausalLM: per-head q/k RMSNorm, explicit head_dim
  kLlava,    // LlavaForConditionalGeneration: the text model is one of the above
};

const char* architecture_name(Architecture arch);

enum class RopeScalingType {
  kDefault,  // no scaling
  kLinear,   // positions divided by factor
  kDynamic,  // NTK-aware base growth once a sequence passes original_max_position_embeddings
  kLlama3,   // Llama 3.1 frequency-band scaling
  kYarn,     // YaRN band interpolation + attention factor on cos/sin
};

const char* rope_scaling_name(RopeScalingType type);

struct RopeConfig {
  RopeScalingType type = RopeScalingType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3, dynamic, yarn: the context the model was trained with
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: not given
  double mscale_all_dim = 0.0;    // 0: not given
  double attention_factor = 0.0;  // 0: not given, derived from factor
  bool truncate = true;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;  // as written in config.json "architectures"
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;             // Qwen2, or Llama with attention_bias
  bool qk_norm = false;              // Qwen3
  DType torch_dtype = DType::kBF16;  // storage type the checkpoint declares
  RopeConfig rope;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
  // Prefix of the text model's tensor names ("model." for plain models; LLaVA nests it).
  std::string text_prefix = "model.";
  std::string lm_head_name = "lm_head.weight";
  // quantization_config: how the decoder layers' linear weights are stored.
  QuantConfig quant;
};

// Parses config.json text. Errors name the offending key.
Result<ModelConfig> parse_model_config(const std::string& json_text);
Result<ModelConfig> parse_model_config(const nlohmann::json& json);

}  // namespace litellama
