// Loading Hugging Face model directories: every error path names what is wrong, sharded and
// single-file checkpoints load the same tensors, LLaVA's nested names are found.
#include <filesystem>
#include <fstream>
#include <set>

#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/worker/checkpoint.h"
#include "services/worker/random_checkpoint.h"
#include "services/worker/safetensors.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes preset `preset` with `seed` into dir and copies out every tensor of its
// model.safetensors (for tests that write them again changed).
void make_model_tensors(const std::string& dir, const std::string& preset, uint64_t seed,
                        std::vector<SafetensorsTensor>* tensors) {
  ASSERT_NO_FATAL_FAILURE(test::make_model(dir, preset, seed));
  auto mapped = MappedFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  auto entries = parse_safetensors(*mapped);
  ASSERT_TRUE(entries.is_ok()) << entries.status().to_string();
  for (const auto& e : *entries) {
    const uint8_t* data = mapped->data() + e.offset_bytes;
    tensors->push_back({e.name, e.dtype, e.shape, std::vector<uint8_t>(data, data + e.size_bytes)});
  }
}

// Expects open(dir) to fail with `code` and a message containing `needle`.
void expect_open_error(const std::string& dir, StatusCode code, const std::string& needle) {
  auto ckpt = Checkpoint::open(dir);
  ASSERT_FALSE(ckpt.is_ok());
  EXPECT_EQ(ckpt.status().code(), code) << ckpt.status().to_string();
  EXPECT_NE(ckpt.status().message().find(needle), std::string::npos)
      << "message was: " << ckpt.status().message();
}

TEST(CheckpointTest, LoadsAndValidatesAModel) {
  test::TempDir tmp;
  auto ckpt = test::open_new_model(tmp.path(), "qwen3-tiny");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const ModelConfig& c = ckpt->config();
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_heads * c.head_dim, 512);  // explicit head_dim, not hidden / heads
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(ckpt->lm_head_name(), "model.embed_tokens.weight");
  auto q_norm = ckpt->tensor("model.layers.1.self_attn.q_norm.weight");
  ASSERT_TRUE(q_norm.is_ok());
  EXPECT_EQ(q_norm->shape, std::vector<int64_t>{128});
  EXPECT_EQ(ckpt->tensor("nope").status().code(), StatusCode::kNotFound);
}

// The benchmarks' 4-bit random checkpoints: GPTQ tensors the loader accepts, every weight one of
// the 16 steps of its group's scale around zero point 8, within the dense initializer's range.
TEST(CheckpointTest, RandomInt4CheckpointLoadsAsGptq) {
  test::TempDir tmp;
  auto preset = find_random_checkpoint_preset("llama3-tiny");
  ASSERT_TRUE(preset.is_ok());
  RandomCheckpointOptions options;
  options.storage_dtype = DType::kBF16;
  options.int4_group = 32;
  ASSERT_TRUE(write_random_checkpoint(tmp.path(), preset->config, options).is_ok());
  auto ckpt = Checkpoint::open(tmp.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->config().quant.method, QuantMethod::kGptq);
  EXPECT_EQ(ckpt->config().quant.group_size, 32);
  const LayerTensorNames n = ckpt->layer_names(1);
  ASSERT_TRUE(ckpt->is_quantized(n.down));
  auto q = ckpt->int4_linear(n.down);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  std::set<int> codes;
  for (uint8_t c : q->codes) codes.insert(c);
  EXPECT_EQ(codes.size(), 16u);
  for (uint8_t z : q->zeros) ASSERT_EQ(z, 8);
  auto w = ckpt->linear_f32(n.down);
  ASSERT_TRUE(w.is_ok());
  const float s = q->scales[0];
  EXPECT_GT(s, 0.0f);
  for (float v : *w) {
    ASSERT_GE(v, -8 * s);
    ASSERT_LE(v, 7 * s);
  }
  auto head = ckpt->tensor(ckpt->lm_head_name());
  ASSERT_TRUE(head.is_ok());
  EXPECT_EQ(head->dtype, DType::kBF16);

  // Sharded, the index records the bytes written; LLaVA is refused (its tower must stay dense).
  options.n_shards = 2;
  ASSERT_TRUE(write_random_checkpoint(tmp.sub("sharded"), preset->config, options).is_ok());
  auto sharded = Checkpoint::open(tmp.sub("sharded"));
  ASSERT_TRUE(sharded.is_ok()) << sharded.status().to_string();
  const auto shards = sharded->shard_bytes();
  int64_t sum = 0;
  for (int64_t b : shards) sum += b;
  std::ifstream index(tmp.sub("sharded") + "/model.safetensors.index.json");
  EXPECT_EQ(json::parse(index)["metadata"]["total_size"].get<int64_t>(), sum);
  auto llava = find_random_checkpoint_preset("llava-tiny");
  ASSERT_TRUE(llava.is_ok());
  EXPECT_FALSE(write_random_checkpoint(tmp.sub("llava"), llava->config, options).is_ok());
}

TEST(CheckpointTest, ShardedCheckpointHoldsTheSameTensors) {
  test::TempDir tmp;
  test::make_model(tmp.sub("one"), "llama2-linear-tiny", 5, 1);
  test::make_model(tmp.sub("three"), "llama2-linear-tiny", 5, 3);
  EXPECT_TRUE(fs::exists(tmp.sub("three") + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(tmp.sub("three") + "/model-00003-of-00003.safetensors"));
  auto one = Checkpoint::open(tmp.sub("one"));
  auto three = Checkpoint::open(tmp.sub("three"));
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  ASSERT_TRUE(three.is_ok()) << three.status().to_string();
  ASSERT_EQ(one->tensor_names(), three->tensor_names());
  for (const auto& name : one->tensor_names()) {
    auto a = one->tensor(name);
    auto b = three->tensor(name);
    ASSERT_EQ(a->size_bytes, b->size_bytes);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->size_bytes), 0) << name;
  }
}

TEST(CheckpointTest, Bf16AndF16StorageUpcast) {
  test::TempDir tmp;
  test::make_model(tmp.sub("f32"), "mistral-tiny", 9, 1, DType::kF32);
  test::make_model(tmp.sub("bf16"), "mistral-tiny", 9, 1, DType::kBF16);
  test::make_model(tmp.sub("f16"), "mistral-tiny", 9, 1, DType::kF16);
  auto f32 = Checkpoint::open(tmp.sub("f32"));
  auto bf16 = Checkpoint::open(tmp.sub("bf16"));
  auto f16 = Checkpoint::open(tmp.sub("f16"));
  ASSERT_TRUE(f32.is_ok() && bf16.is_ok() && f16.is_ok());
  EXPECT_EQ(bf16->config().torch_dtype, DType::kBF16);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  auto a = f32->tensor(name)->to_f32();
  auto b = bf16->tensor(name)->to_f32();
  auto h = f16->tensor(name)->to_f32();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], std::abs(a[i]) * (1.0f / 128) + 1e-30f);
    ASSERT_NEAR(a[i], h[i], std::abs(a[i]) * (1.0f / 1024) + 1e-7f);
  }
}

TEST(CheckpointTest, MissingThingsAreNamed) {
  test::TempDir tmp;
  expect_open_error(tmp.sub("absent"), StatusCode::kNotFound, "does not exist");
  fs::create_directories(tmp.sub("empty"));
  expect_open_error(tmp.sub("empty"), StatusCode::kNotFound, "has no config.json");

  test::make_model(tmp.sub("m"), "llama3-tiny", 1);
  fs::rename(tmp.sub("m") + "/model.safetensors", tmp.sub("m.safetensors"));
  expect_open_error(tmp.sub("m"), StatusCode::kNotFound, "neither model.safetensors");
}

TEST(CheckpointTest, BadConfigJson) {
  test::TempDir tmp;
  test::make_model(tmp.path(), "llama3-tiny", 1);
  const std::string config = tmp.path() + "/config.json";
  const std::string original = read_bytes(config);

  write_text(config, "{ not json");
  expect_open_error(tmp.path(), StatusCode::kInvalidArgument, "not valid JSON");

  json j = json::parse(original);
  j["architectures"] = {"GPT2LMHeadModel"};
  write_text(config, j.dump());
  expect_open_error(tmp.path(), StatusCode::kUnsupported, "architecture 'GPT2LMHeadModel'");

  j = json::parse(original);
  j.erase("hidden_size");
  write_text(config, j.dump());
  expect_open_error(tmp.path(), StatusCode::kInvalidArgument, "missing key 'hidden_size'");

  j = json::parse(original);
  j["num_key_value_heads"] = 3;
  write_text(config, j.dump());
  expect_open_error(tmp.path(), StatusCode::kInvalidArgument, "not a multiple");

  j = json::parse(original);
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  write_text(config, j.dump());
  expect_open_error(tmp.path(), StatusCode::kUnsupported, "rope scaling type 'longrope'");

  j = json::parse(original);
  j["hidden_act"] = "gelu";
  write_text(config, j.dump());
  expect_open_error(tmp.path(), StatusCode::kUnsupported, "hidden_act 'gelu'");
}

TEST(CheckpointTest, TensorsThatDisagreeWithTheConfig) {
  test::TempDir tmp;
  test::make_model(tmp.path(), "llama3-tiny", 1);
  const std::string config = tmp.path() + "/config.json";
  json j = json::parse(read_bytes(config));

  json wider = j;
  wider["intermediate_size"] = 256;
  write_text(config, wider.dump());
  expect_open_error(tmp.path(), StatusCode::kInvalidArgument,
                    "'model.layers.0.mlp.gate_proj.weight' has shape [128, 64] but config.json "
                    "implies [256, 64]");

  json untied = j;
  untied["tie_word_embeddings"] = false;
  write_text(config, untied.dump());
  expect_open_error(tmp.path(), StatusCode::kNotFound, "missing tensor 'lm_head.weight'");

  json deeper = j;
  deeper["num_hidden_layers"] = 3;
  write_text(config, deeper.dump());
  expect_open_error(tmp.path(), StatusCode::kNotFound, "model.layers.2.input_layernorm.weight");
}

TEST(CheckpointTest, TruncatedAndCorruptSafetensors) {
  test::TempDir tmp;
  test::make_model(tmp.path(), "llama2-linear-tiny", 1);
  const std::string file = tmp.path() + "/model.safetensors";
  const std::string bytes = read_bytes(file);

  write_text(file, bytes.substr(0, bytes.size() - 100));
  expect_open_error(tmp.path(), StatusCode::kDataLoss, "truncated or corrupt");

  write_text(file, bytes.substr(0, 4));
  expect_open_error(tmp.path(), StatusCode::kDataLoss, "truncated safetensors file");

  std::string huge_header = bytes;
  huge_header[6] = '\x7f';  // header length far beyond the file
  write_text(file, huge_header);
  expect_open_error(tmp.path(), StatusCode::kDataLoss, "does not fit");

  std::string garbage = bytes;
  garbage[9] = '#';  // inside the JSON header
  write_text(file, garbage);
  expect_open_error(tmp.path(), StatusCode::kDataLoss, "not a JSON object");

  write_text(file, "");
  expect_open_error(tmp.path(), StatusCode::kDataLoss, "truncated safetensors file (0 bytes)");
}

TEST(CheckpointTest, WrongDtypeAndBadIndex) {
  test::TempDir tmp;
  // Rewrite one tensor as I32.
  {
    std::vector<SafetensorsTensor> tensors;
    ASSERT_NO_FATAL_FAILURE(make_model_tensors(tmp.path(), "llama2-linear-tiny", 1, &tensors));
    for (SafetensorsTensor& t : tensors) {
      if (t.name == "model.norm.weight") t.dtype = DType::kI32;
    }
    ASSERT_TRUE(write_safetensors(tmp.sub("i32.safetensors"), tensors).is_ok());
  }
  fs::rename(tmp.sub("i32.safetensors"), tmp.path() + "/model.safetensors");
  expect_open_error(tmp.path(), StatusCode::kUnsupported, "'model.norm.weight' is I32");

  test::TempDir sharded;
  test::make_model(sharded.path(), "llama2-linear-tiny", 1, 2);
  fs::remove(sharded.path() + "/model-00002-of-00002.safetensors");
  expect_open_error(sharded.path(), StatusCode::kNotFound, "model-00002-of-00002.safetensors");
  write_text(sharded.path() + "/model.safetensors.index.json", "[1, 2]");
  expect_open_error(sharded.path(), StatusCode::kInvalidArgument, "weight_map");
  write_text(sharded.path() + "/model.safetensors.index.json",
             R"({"weight_map": {"model.norm.weight": "../../etc/passwd"}})");
  expect_open_error(sharded.path(), StatusCode::kInvalidArgument, "not a plain file name");
}

TEST(CheckpointTest, LlavaTextModelUnderItsPublishedNames) {
  test::TempDir tmp;
  // Re-publish the tensors under LLaVA-1.5's names with a LLaVA config.
  std::vector<SafetensorsTensor> tensors;
  ASSERT_NO_FATAL_FAILURE(make_model_tensors(tmp.path(), "llama2-linear-tiny", 3, &tensors));
  for (SafetensorsTensor& t : tensors) t.name = "language_model." + t.name;
  // A small vision tower beside it (zeros: only names and shapes matter to the loader).
  const json vision = {{"model_type", "clip_vision_model"},
                       {"hidden_size", 8},
                       {"intermediate_size", 16},
                       {"num_hidden_layers", 1},
                       {"num_attention_heads", 2},
                       {"image_size", 4},
                       {"patch_size", 2}};
  json text = json::parse(read_bytes(tmp.path() + "/config.json"));
  text["model_type"] = "llama";
  text.erase("architectures");
  text.erase("bos_token_id");
  json config = {{"architectures", {"LlavaForConditionalGeneration"}},
                 {"model_type", "llava"},
                 {"text_config", text},
                 {"vision_config", vision},
                 {"vision_feature_layer", -1},
                 {"image_token_index", 31999}};
  auto parsed = parse_llava_config(config);
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  for (const auto& [name, shape] : llava_vision_tensor_specs(*parsed, LlavaTensorNames{})) {
    int64_t n = 4;
    for (int64_t d : shape) n *= d;
    tensors.push_back({name, DType::kF32, shape, std::vector<uint8_t>(static_cast<size_t>(n), 0)});
  }
  const std::string llava = tmp.sub("llava");
  fs::create_directories(llava);
  ASSERT_TRUE(write_safetensors(llava + "/model.safetensors", tensors).is_ok());
  write_text(llava + "/config.json", config.dump());
  auto ckpt = Checkpoint::open(llava);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->config().arch, Architecture::kLlava);
  EXPECT_EQ(ckpt->config().text_prefix, "language_model.model.");
  EXPECT_EQ(ckpt->lm_head_name(), "language_model.lm_head.weight");
  EXPECT_EQ(ckpt->config().rope.type, RopeScalingType::kLinear);
  EXPECT_EQ(ckpt->config().bos_token_id, 1);  // LlamaConfig default for the text model
  ASSERT_NE(ckpt->llava(), nullptr);
  EXPECT_EQ(ckpt->llava()->n_image_tokens(), 4);
  EXPECT_EQ(ckpt->llava()->image_token_id, 31999);
  EXPECT_EQ(ckpt->llava()->vision.layer_norm_eps, 1e-5);  // CLIPVisionConfig's default

  // The vision half's config errors name their key.
  for (const auto& [key, value, what] :
       {std::tuple<const char*, json, const char*>{"vision_feature_layer", 5,
                                                   "vision_feature_layer"},
        {"vision_feature_layer", json::array({-2, -1}), "lists of layers"},
        {"vision_feature_select_strategy", "cls", "vision_feature_select_strategy"},
        {"projector_hidden_act", "relu", "projector_hidden_act"},
        {"image_token_index", 32000, "image token id 32000"},
        {"image_seq_length", 576, "image_seq_length 576"}}) {
    json bad = config;
    bad[key] = value;
    auto r = parse_llava_config(bad);
    ASSERT_FALSE(r.is_ok()) << key;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  }
  json siglip = config;
  siglip["vision_config"]["model_type"] = "siglip_vision_model";
  EXPECT_EQ(parse_llava_config(siglip).status().code(), StatusCode::kUnsupported);

  // A LLaVA-1.5 text_config leaves most sizes at LlamaConfig's defaults.
  auto defaults = parse_model_config(std::string(
      R"({"architectures": ["LlavaForConditionalGeneration"],
          "text_config": {"model_type": "llama", "vocab_size": 32064}})"));
  ASSERT_TRUE(defaults.is_ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->hidden_size, 4096);
  EXPECT_EQ(defaults->n_layers, 32);
  EXPECT_EQ(defaults->intermediate_size, 11008);
  EXPECT_EQ(defaults->vocab_size, 32064);
}

}  // namespace
}  // namespace litellama

namespace litellama {
namespace {

// As AutoModelForCausalLM: a config.json without "architectures" takes its class from
// "model_type"; every preset's config parses to the same model either way.
TEST(ModelConfigTest, ModelTypeStandsInForMissingArchitectures) {
  const std::pair<const char*, Architecture> expected[] = {
      {"llama3-tiny", Architecture::kLlama}, {"mistral-tiny", Architecture::kMistral},
      {"qwen2-tiny", Architecture::kQwen2},  {"qwen3-tiny", Architecture::kQwen3},
      {"hd80-tiny", Architecture::kQwen2},
  };
  for (const auto& [name, arch] : expected) {
    SCOPED_TRACE(name);
    auto preset = find_random_checkpoint_preset(name);
    ASSERT_TRUE(preset.is_ok()) << preset.status().to_string();
    json config = preset->config;
    auto with = parse_model_config(config);
    ASSERT_TRUE(with.is_ok()) << with.status().to_string();
    config.erase("architectures");
    auto without = parse_model_config(config);
    ASSERT_TRUE(without.is_ok()) << without.status().to_string();
    EXPECT_EQ(without->arch, arch);
    EXPECT_EQ(without->arch_name, with->arch_name);
    EXPECT_EQ(without->head_dim, with->head_dim);
    EXPECT_EQ(without->qkv_bias, with->qkv_bias);
    EXPECT_EQ(without->qk_norm, with->qk_norm);
    config["architectures"] = nullptr;  // a null list counts as missing, as in transformers
    auto null_list = parse_model_config(config);
    ASSERT_TRUE(null_list.is_ok()) << null_list.status().to_string();
    EXPECT_EQ(null_list->arch, arch);
  }
  // LLaVA: the nested text model, class from the top-level model_type.
  auto llava = parse_model_config(std::string(
      R"({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 32064}})"));
  ASSERT_TRUE(llava.is_ok()) << llava.status().to_string();
  EXPECT_EQ(llava->arch, Architecture::kLlava);

  auto unknown = parse_model_config(std::string(R"({"model_type": "gpt2", "hidden_size": 64})"));
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("model_type 'gpt2'"), std::string::npos);
  auto neither = parse_model_config(std::string(R"({"hidden_size": 64})"));
  ASSERT_FALSE(neither.is_ok());
  EXPECT_NE(neither.status().message().find("neither 'architectures' nor 'model_type'"),
            std::string::npos)
      << neither.status().message();
  auto not_a_list = parse_model_config(std::string(R"({"architectures": "LlamaForCausalLM"})"));
  ASSERT_FALSE(not_a_list.is_ok());
  EXPECT_NE(not_a_list.status().message().find("must be a list"), std::string::npos);
}

}  // namespace
}  // namespace litellama
