#include "services/worker/random_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/splitmix64.h"
#include "services/worker/llava_config.h"
#include "services/worker/model_config.h"
#include "services/worker/quantize.h"
#include "services/worker/safetensors.h"

namespace litellama {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  return splitmix64(seed ^ fnv1a(name));
}

// Element `index` of the tensor keyed `key`: uniform in [-1, 1), exact in float32 (24 bits).
float unit_value(uint64_t key, uint64_t index) {
  const uint64_t r = splitmix64(key + index * 0x9e3779b97f4a7c15ull);
  return static_cast<float>(r >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

// head_dim 0: hidden / heads. The test presets use 64 (narrow models, GPU-supported head size).
json llama_config(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t max_pos, double theta, bool tied,
                  int64_t head_dim = 0) {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"head_dim", head_dim > 0 ? head_dim : hidden / heads},
              {"max_position_embeddings", max_pos},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", theta},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", tied},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"hidden_act", "silu"},
              {"bos_token_id", 128000},
              {"eos_token_id", json::array({128001, 128008, 128009})}};
}

json llama3_rope(double factor, int64_t original) {
  return json{{"rope_type", "llama3"},
              {"factor", factor},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", original}};
}

json with_llama2_ids(json c) {
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  return c;
}

json qwen_config(const char* arch, const char* type, int64_t hidden, int64_t inter, int64_t layers,
                 int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_pos, bool tied) {
  return json{{"architectures", {arch}},      {"model_type", type},
              {"vocab_size", 151936},         {"hidden_size", hidden},
              {"intermediate_size", inter},   {"num_hidden_layers", layers},
              {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
              {"head_dim", head_dim},         {"max_position_embeddings", max_pos},
              {"rms_norm_eps", 1e-6},         {"rope_theta", 1000000.0},
              {"rope_scaling", nullptr},      {"tie_word_embeddings", tied},
              {"use_sliding_window", false},  {"sliding_window", nullptr},
              {"hidden_act", "silu"},         {"attention_bias", std::string(type) == "qwen2"},
              {"bos_token_id", 151643},       {"eos_token_id", 151645}};
}

// CLIPVisionConfig of a LLaVA-1.5 tower (RGB input, quick_gelu, layer norm eps 1e-5).
json clip_vision_config(int64_t hidden, int64_t intermediate, int64_t n_layers, int64_t n_heads,
                        int64_t image_size, int64_t patch_size, int64_t projection_dim) {
  return json{{"model_type", "clip_vision_model"}, {"hidden_size", hidden},
              {"intermediate_size", intermediate}, {"num_hidden_layers", n_layers},
              {"num_attention_heads", n_heads},    {"num_channels", 3},
              {"image_size", image_size},          {"patch_size", patch_size},
              {"hidden_act", "quick_gelu"},        {"layer_norm_eps", 1e-5},
              {"projection_dim", projection_dim}};
}

// A LLaVA-1.5 config around a Llama text config (whose own class name and embedding tying give
// way to the outer config's).
json llava_config(json text, json vision, int64_t image_seq_length) {
  for (const char* k : {"architectures", "tie_word_embeddings"}) text.erase(k);
  return json{{"architectures", {"LlavaForConditionalGeneration"}},
              {"model_type", "llava"},
              {"text_config", std::move(text)},
              {"vision_config", std::move(vision)},
              {"vision_feature_layer", -2},
              {"vision_feature_select_strategy", "default"},
              {"projector_hidden_act", "gelu"},
              {"multimodal_projector_bias", true},
              {"image_token_index", 32000},
              {"image_seq_length", image_seq_length},
              {"tie_word_embeddings", false}};
}

std::vector<RandomCheckpointPreset> make_presets() {
  std::vector<RandomCheckpointPreset> p;
  // Test models: two layers, tiny widths, the real vocabulary sizes.
  {
    json c = llama_config(128256, 64, 128, 2, 4, 2, 131072, 500000.0, true, 64);
    c["rope_scaling"] = llama3_rope(8.0, 8192);
    p.push_back({"llama3-tiny", "Llama 3.1 graph: GQA 4/2, tied embeddings, llama3 RoPE scaling", c,
                 "llama3_1"});
  }
  {
    json c = llama_config(128256, 64, 160, 2, 8, 1, 8192, 500000.0, false, 64);
    p.push_back({"llama3-untied-tiny", "Llama 3 graph: GQA 8/1, untied embeddings, plain RoPE", c,
                 "llama3"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 64, 128, 2, 4, 4, 4096, 10000.0, false, 64));
    c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    p.push_back({"llama2-linear-tiny", "Llama 2 graph: MHA, linear RoPE scaling", c, "llama2"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 64, 128, 2, 4, 4, 32, 10000.0, false, 64));
    c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
    p.push_back({"llama2-dynamic-tiny",
                 "Llama 2 graph with dynamic NTK RoPE past a 32-token original context", c,
                 "llama2"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 64, 128, 2, 4, 1, 4096, 1000000.0, false, 64));
    c["architectures"] = {"MistralForCausalLM"};
    c["model_type"] = "mistral";
    c["sliding_window"] = nullptr;
    c.erase("mlp_bias");
    c.erase("attention_bias");
    p.push_back({"mistral-tiny", "Mistral graph (no sliding window): GQA 4/1", c, "llama2"});
  }
  {
    json c = qwen_config("Qwen2ForCausalLM", "qwen2", 64, 128, 2, 4, 2, 64, 4096, true);
    p.push_back({"qwen2-tiny", "Qwen2 graph: q/k/v bias, tied embeddings", c, "qwen3"});
  }
  {
    json c = qwen_config("Qwen2ForCausalLM", "qwen2", 64, 128, 2, 4, 2, 64, 128, false);
    c["rope_scaling"] = {
        {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
    p.push_back({"qwen2-yarn-tiny", "Qwen2 graph with YaRN RoPE scaling (4x of 32)", c, "qwen3"});
  }
  {
    json c = qwen_config("Qwen3ForCausalLM", "qwen3", 64, 128, 2, 4, 2, 128, 40960, true);
    p.push_back({"qwen3-tiny", "Qwen3 graph: per-head q/k RMSNorm, head_dim 128 != hidden/heads", c,
                 "qwen3"});
  }
  // Every head size the attention kernels take, each with another query/KV head ratio: the CUDA
  // backend's general attention path (head sizes other than 64 and 128) against transformers,
  // whose configs need hidden_size to be a multiple of the query heads.
  {
    json c = with_llama2_ids(llama_config(32000, 64, 128, 2, 4, 1, 4096, 10000.0, false, 16));
    p.push_back({"hd16-tiny", "Llama 2 graph, head_dim 16, GQA 4/1", c, "llama2"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 192, 256, 2, 6, 2, 4096, 10000.0, true, 32));
    p.push_back({"hd32-tiny", "Llama 2 graph, head_dim 32, GQA 6/2, tied embeddings", c, "llama2"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 64, 128, 2, 4, 4, 4096, 10000.0, false, 48));
    p.push_back({"hd48-tiny", "Llama 2 graph, head_dim 48, MHA 4/4", c, "llama2"});
  }
  {
    json c = qwen_config("Qwen2ForCausalLM", "qwen2", 64, 128, 2, 4, 1, 80, 4096, true);
    p.push_back({"hd80-tiny", "Qwen2 graph (q/k/v bias), head_dim 80, GQA 4/1", c, "qwen3"});
  }
  {
    json c = with_llama2_ids(llama_config(32000, 448, 512, 2, 7, 1, 4096, 10000.0, false, 96));
    p.push_back({"hd96-tiny", "Llama 2 graph, head_dim 96, GQA 7/1", c, "llama2"});
  }
  {
    json c = qwen_config("Qwen3ForCausalLM", "qwen3", 64, 128, 2, 4, 2, 256, 40960, true);
    p.push_back({"hd256-tiny", "Qwen3 graph (q/k RMSNorm), head_dim 256, GQA 4/2", c, "qwen3"});
  }
  // The former embedded default (before models/default was trained): a small Llama 3 with the
  // real Llama 3.1 tokenizer and seeded random weights, kept for tests and benchmarks.
  {
    json c = llama_config(128256, 256, 768, 4, 8, 2, 131072, 500000.0, true);
    c["rope_scaling"] = llama3_rope(8.0, 8192);
    p.push_back(
        {"default-random", "Llama 3.1 graph, 4 layers, hidden 256, random weights", c, "llama3_1"});
  }
  // LLaVA-1.5: a CLIP vision tower and projector in front of a Llama text model, tensors under
  // LLaVA-1.5's published names (vision_tower., multi_modal_projector., language_model.).
  {
    const json text =
        with_llama2_ids(llama_config(32064, 64, 128, 2, 4, 2, 4096, 10000.0, false, 16));
    // 30 px images in 6 px patches: 25 patches (CLS dropped), three 16-wide heads, 3 layers of
    // which the features take the output of the second (vision_feature_layer -2).
    p.push_back({"llava-tiny",
                 "LLaVA-1.5 graph: CLIP ViT 30 px / 6 px patches, 3 layers; Llama text",
                 llava_config(text, clip_vision_config(48, 96, 3, 3, 30, 6, 32), 25), "llama2"});
  }
  {
    const json text =
        with_llama2_ids(llama_config(32064, 4096, 11008, 32, 32, 32, 4096, 10000.0, false));
    p.push_back({"llava1.5-7b", "LLaVA-1.5-7B shape (CLIP ViT-L/14 336 px, Llama 2 7B)",
                 llava_config(text, clip_vision_config(1024, 4096, 24, 16, 336, 14, 768), 576),
                 "llama2"});
  }
  // Benchmark shapes (published architectures, random weights).
  {
    json c = llama_config(128256, 2048, 8192, 16, 32, 8, 131072, 500000.0, true);
    c["rope_scaling"] = llama3_rope(32.0, 8192);
    p.push_back({"llama3.2-1b", "Llama-3.2-1B shape", c, "llama3_1"});
  }
  {
    json c = llama_config(128256, 4096, 14336, 32, 32, 8, 131072, 500000.0, false);
    c["rope_scaling"] = llama3_rope(8.0, 8192);
    p.push_back({"llama3.1-8b", "Llama-3.1-8B shape", c, "llama3_1"});
  }
  {
    json c = qwen_config("Qwen2ForCausalLM", "qwen2", 1536, 8960, 28, 12, 2, 128, 32768, true);
    p.push_back({"qwen2.5-1.5b", "Qwen2.5-1.5B shape", c, "qwen3"});
  }
  return p;
}

// Scale of the uniform distribution per tensor kind: unit-variance-preserving projections,
// norms around 1, embeddings and biases large enough that they matter.
struct TensorInit {
  float center = 0.0f;
  float half_width = 1.0f;
};

TensorInit init_for(const std::string& name, const std::vector<int64_t>& shape) {
  auto ends_with = [&](const char* s) {
    const std::string suffix(s);
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("norm.weight") || ends_with("layernorm.weight") ||
      ends_with("layer_norm1.weight") || ends_with("layer_norm2.weight")) {
    return {1.0f, 0.2f};
  }
  if (ends_with(".bias")) return {0.0f, 0.5f};
  // Small next to the unit-variance layer outputs, so the layers (not the token's own embedding)
  // decide the next token and greedy outputs are sensitive to every part of the graph.
  if (ends_with("embed_tokens.weight")) return {0.0f, 0.1f};
  // Fan-in: the inputs of one output (a convolution's channels x kernel, a matrix's columns).
  float fan_in = 1.0f;
  if (shape.size() >= 2) {
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= static_cast<float>(shape[i]);
  }
  return {0.0f, std::sqrt(3.0f / fan_in)};
}

std::vector<uint8_t> generate_tensor(uint64_t seed, const std::string& name,
                                     const std::vector<int64_t>& shape, DType dtype) {
  size_t numel = 1;
  for (auto d : shape) numel *= static_cast<size_t>(d);
  const TensorInit init = init_for(name, shape);
  std::vector<uint8_t> bytes(numel * dtype_size_bytes(dtype));
  const uint64_t key = tensor_key(seed, name);
  constexpr size_t kChunk = 1 << 16;
  const auto n_chunks = static_cast<int64_t>((numel + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    float buf[512];
    const size_t begin = static_cast<size_t>(c) * kChunk;
    const size_t end = std::min(numel, begin + kChunk);
    for (size_t i = begin; i < end; i += 512) {
      const size_t n = std::min<size_t>(512, end - i);
      for (size_t j = 0; j < n; ++j)
        buf[j] = init.center + init.half_width * unit_value(key, i + j);
      convert_from_f32(bytes.data() + i * dtype_size_bytes(dtype), dtype, buf, n);
    }
  }
  return bytes;
}

// `weight_name` ([n, k]) as 4-bit GPTQ tensors: random codes, zero points 8 (stored minus one),
// and fp16 scales half_width / 8, so that values lie in the dense initializer's range.
std::vector<SafetensorsTensor> int4_projection(uint64_t seed, const std::string& weight_name,
                                               const std::vector<int64_t>& shape, int64_t group) {
  const std::string module = weight_name.substr(0, weight_name.size() - 7);  // less ".weight"
  const int64_t n = shape[0], k = shape[1], groups = k / group;
  const TensorInit init = init_for(weight_name, shape);
  std::vector<SafetensorsTensor> out(3);
  out[0] = {{module + ".qweight", DType::kI32, {k / 8, n}}, {}};
  out[0].data.resize(static_cast<size_t>(k / 8 * n) * 4);
  const uint64_t key = tensor_key(seed, out[0].name);
  const auto n_words = static_cast<int64_t>(out[0].data.size() / 4);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_words; ++i) {
    const auto word = static_cast<uint32_t>(splitmix64(key + static_cast<uint64_t>(i)) >> 32);
    std::memcpy(out[0].data.data() + i * 4, &word, 4);
  }
  out[1] = {{module + ".qzeros", DType::kI32, {groups, n / 8}}, {}};
  out[1].data.assign(static_cast<size_t>(groups * n / 8) * 4, 0x77);
  out[2] = {{module + ".scales", DType::kF16, {groups, n}}, {}};
  out[2].data.resize(static_cast<size_t>(groups * n) * 2);
  const std::vector<float> scales(static_cast<size_t>(groups * n), init.half_width / 8.0f);
  convert_from_f32(out[2].data.data(), DType::kF16, scales.data(), scales.size());
  return out;
}

// `weight_name` ([n, k]) as FP8 tensors: random e4m3 codes (the NaN codes 0x7f / 0xff replaced by
// the largest finite ones) and float32 scales half_width / 448 per output channel.
std::vector<SafetensorsTensor> fp8_projection(uint64_t seed, const std::string& weight_name,
                                              const std::vector<int64_t>& shape) {
  const std::string module = weight_name.substr(0, weight_name.size() - 7);  // less ".weight"
  const int64_t n = shape[0], k = shape[1];
  const TensorInit init = init_for(weight_name, shape);
  std::vector<SafetensorsTensor> out(2);
  out[0] = {{weight_name, DType::kF8E4M3, {n, k}}, {}};
  out[0].data.resize(static_cast<size_t>(n * k));
  const uint64_t key = tensor_key(seed, weight_name);
  const auto n_words = static_cast<int64_t>(out[0].data.size() / 8);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_words; ++i) {
    uint64_t word = splitmix64(key + static_cast<uint64_t>(i));
    for (int b = 0; b < 8; ++b) {
      if (((word >> (8 * b)) & 0x7f) == 0x7f) word ^= uint64_t{1} << (8 * b);  // 0x7e / 0xfe
    }
    std::memcpy(out[0].data.data() + i * 8, &word, 8);
  }
  out[1] = {{module + ".weight_scale", DType::kF32, {n, 1}}, {}};
  const std::vector<float> scales(static_cast<size_t>(n), init.half_width / 448.0f);
  out[1].data.resize(scales.size() * sizeof(float));
  std::memcpy(out[1].data.data(), scales.data(), out[1].data.size());
  return out;
}

bool is_layer_projection(const std::string& name) {
  return name.find(".layers.") != std::string::npos && name.size() > 12 &&
         name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

}  // namespace

float random_checkpoint_unit(uint64_t seed, const std::string& name, uint64_t index) {
  return unit_value(tensor_key(seed, name), index);
}

const std::vector<RandomCheckpointPreset>& random_checkpoint_presets() {
  static const std::vector<RandomCheckpointPreset> kPresets = make_presets();
  return kPresets;
}

Result<RandomCheckpointPreset> find_random_checkpoint_preset(const std::string& name) {
  std::string names;
  for (const auto& p : random_checkpoint_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return make_error(StatusCode::kNotFound, "no model preset '{}' (presets: {})", name, names);
}

Status write_random_checkpoint(const std::string& dir, json config,
                               const RandomCheckpointOptions& options) {
  if (options.storage_dtype != DType::kF32 && options.storage_dtype != DType::kBF16 &&
      options.storage_dtype != DType::kF16) {
    return make_error(StatusCode::kInvalidArgument,
                      "storage dtype must be float32, bfloat16 or "
                      "float16");
  }
  if (options.n_shards < 1) {
    return make_error(StatusCode::kInvalidArgument, "n_shards must be at least 1");
  }
  config["torch_dtype"] = dtype_torch_name(options.storage_dtype);
  if (options.int4_group > 0 && options.fp8) {
    return make_error(StatusCode::kInvalidArgument,
                      "a random checkpoint is 4-bit or FP8, not both");
  }
  if ((options.int4_group > 0 || options.fp8) && config.value("model_type", "") == "llava") {
    // No GPTQ field keeps a vision tower dense (docs/quantization.md), so LLaVA stays unquantized.
    return make_error(StatusCode::kInvalidArgument,
                      "quantized random checkpoints are written for text models only");
  }
  if (options.fp8) {
    QuantizeOptions fp8;
    fp8.method = QuantizeMethod::kFp8;
    config["quantization_config"] = quantization_config(fp8, ModelConfig{});
  }
  if (options.int4_group > 0) {
    config["quantization_config"] = {{"quant_method", "gptq"},
                                     {"bits", 4},
                                     {"group_size", options.int4_group},
                                     {"sym", true},
                                     {"desc_act", false},
                                     {"checkpoint_format", "gptq"}};
  }
  LITELLAMA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(config));

  // Tensor names and shapes come from the same table the loader validates against.
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs;
  const int64_t h = mc.hidden_size, q_dim = int64_t{mc.n_heads} * mc.head_dim,
                kv_dim = int64_t{mc.n_kv_heads} * mc.head_dim, inter = mc.intermediate_size;
  // LLaVA nests the text model (LLaVA-1.5's published layout) beside its vision tower.
  const bool llava = mc.arch == Architecture::kLlava;
  const std::string text = llava ? "language_model.model." : "model.";
  specs.push_back({text + "embed_tokens.weight", {mc.vocab_size, h}});
  for (int32_t l = 0; l < mc.n_layers; ++l) {
    const std::string p = text + "layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "self_attn.q_proj.weight", {q_dim, h}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_dim, h}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_dim, h}});
    if (mc.qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q_dim}});
      specs.push_back({p + "self_attn.k_proj.bias", {kv_dim}});
      specs.push_back({p + "self_attn.v_proj.bias", {kv_dim}});
    }
    if (mc.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {mc.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", {mc.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {h, q_dim}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.up_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  specs.push_back({text + "norm.weight", {h}});
  if (!mc.tie_word_embeddings) {
    specs.push_back(
        {llava ? "language_model.lm_head.weight" : "lm_head.weight", {mc.vocab_size, h}});
  }
  json preprocessor;
  if (llava) {
    LITELLAMA_ASSIGN_OR_RETURN(LlavaConfig lc, parse_llava_config(config));
    for (auto& spec : llava_vision_tensor_specs(lc, LlavaTensorNames{})) {
      specs.push_back(std::move(spec));
    }
    // CLIPImageProcessor as LLaVA-1.5 publishes it, at the tower's image size.
    const int32_t side = lc.vision.image_size;
    preprocessor = {{"image_processor_type", "CLIPImageProcessor"},
                    {"processor_class", "LlavaProcessor"},
                    {"do_resize", true},
                    {"size", {{"shortest_edge", side}}},
                    {"resample", 3},
                    {"do_center_crop", true},
                    {"crop_size", {{"height", side}, {"width", side}}},
                    {"do_rescale", true},
                    {"rescale_factor", 1.0 / 255.0},
                    {"do_normalize", true},
                    {"image_mean", {0.48145466, 0.4578275, 0.40821073}},
                    {"image_std", {0.26862954, 0.26130258, 0.27577711}},
                    {"do_convert_rgb", true}};
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(StatusCode::kInvalidArgument, "cannot create '{}': {}", dir, ec.message());
  {
    std::ofstream out(fs::path(dir) / "config.json");
    out << config.dump(2) << "\n";
    if (!out) return make_error(StatusCode::kInternal, "cannot write config.json in '{}'", dir);
  }
  if (!preprocessor.is_null()) {
    std::ofstream out(fs::path(dir) / "preprocessor_config.json");
    out << preprocessor.dump(2) << "\n";
    if (!out) {
      return make_error(StatusCode::kInternal, "cannot write preprocessor_config.json in '{}'",
                        dir);
    }
  }
  // Shards hold consecutive runs of tensors, of about equal byte size.
  size_t total_bytes = 0;
  for (const auto& [name, shape] : specs) {
    size_t n = dtype_size_bytes(options.storage_dtype);
    for (auto d : shape) n *= static_cast<size_t>(d);
    total_bytes += n;
  }
  const size_t shard_target = (total_bytes + options.n_shards - 1) / options.n_shards;
  // total_bytes above sizes the shards (4-bit projections are smaller than counted there); the
  // index records what was written.
  size_t written_bytes = 0;
  json weight_map = json::object();
  std::vector<SafetensorsTensor> shard;
  size_t shard_bytes = 0;
  int32_t shard_index = 0;
  auto shard_name = [&](int32_t i) {
    if (options.n_shards == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, options.n_shards);
    return std::string(buf);
  };
  auto flush = [&]() -> Status {
    const std::string name = shard_name(shard_index);
    for (const auto& t : shard) {
      weight_map[t.name] = name;
      written_bytes += t.data.size();
    }
    LITELLAMA_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / name).string(), shard));
    shard.clear();
    shard_bytes = 0;
    ++shard_index;
    return Status::ok();
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, shape] = specs[i];
    if ((options.int4_group > 0 || options.fp8) && is_layer_projection(name)) {
      for (SafetensorsTensor& t :
           options.fp8 ? fp8_projection(options.seed, name, shape)
                       : int4_projection(options.seed, name, shape, options.int4_group)) {
        shard_bytes += t.data.size();
        shard.push_back(std::move(t));
      }
    } else {
      SafetensorsTensor t{{name, options.storage_dtype, shape},
                          generate_tensor(options.seed, name, shape, options.storage_dtype)};
      shard_bytes += t.data.size();
      shard.push_back(std::move(t));
    }
    const size_t remaining_tensors = specs.size() - i - 1;
    const int32_t remaining_shards = options.n_shards - shard_index - 1;
    if (remaining_shards > 0 && (shard_bytes >= shard_target ||
                                 remaining_tensors == static_cast<size_t>(remaining_shards))) {
      LITELLAMA_RETURN_IF_ERROR(flush());
    }
  }
  if (!shard.empty() || shard_index < options.n_shards) LITELLAMA_RETURN_IF_ERROR(flush());
  if (options.n_shards > 1) {
    json index = {{"metadata", {{"total_size", written_bytes}}}, {"weight_map", weight_map}};
    std::ofstream out(fs::path(dir) / "model.safetensors.index.json");
    out << index.dump(2) << "\n";
  }
  if (!options.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      const fs::path src = fs::path(options.tokenizer_dir) / f;
      if (!fs::exists(src)) {
        return make_error(StatusCode::kNotFound,
                          "tokenizer file '{}' not found (run "
                          "scripts/fetch-assets.sh)",
                          src.string());
      }
      fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing, ec);
      if (ec)
        return make_error(StatusCode::kInternal, "cannot copy '{}': {}", src.string(),
                          ec.message());
    }
    // A LLaVA checkpoint's tokenizer has "<image>" as an added token with the image token's id,
    // as LLaVA-1.5 publishes it, so that "<image>" in a text prompt encodes to that one id.
    if (config.contains("vision_config") && config.contains("image_token_index")) {
      const fs::path path = fs::path(dir) / "tokenizer.json";
      std::ifstream in(path);
      json tok = json::parse(in, nullptr, false);
      in.close();
      if (tok.is_object() && tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
        tok["added_tokens"].push_back({{"id", config["image_token_index"]},
                                       {"content", "<image>"},
                                       {"single_word", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"normalized", false},
                                       {"special", true}});
        std::ofstream out(path);
        out << tok.dump(2) << "\n";
        if (!out) return make_error(StatusCode::kInternal, "cannot write '{}'", path.string());
      }
    }
  }
  return Status::ok();
}

}  // namespace litellama
