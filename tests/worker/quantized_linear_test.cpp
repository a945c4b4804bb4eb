// Quantized checkpoints: quantization_config parsing, the FP8 conversions, and the dequantization
// of each layout against tests/golden/quant (made by tests/golden/make_quant_golden.py, an
// independent numpy unpacker written from the formats' descriptions), bit for bit.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "services/worker/quant_config.h"
#include "services/worker/quantized_linear.h"
#include "services/worker/safetensors.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Result<QuantConfig> parse(const json& quantization_config) {
  return parse_quant_config(json{{"quantization_config", quantization_config}});
}

// The message of a parse that must fail.
std::string parse_error(const json& quantization_config) {
  auto q = parse(quantization_config);
  EXPECT_FALSE(q.is_ok()) << quantization_config.dump();
  return q.is_ok() ? "" : q.status().message();
}

json fp8_config() {
  return json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                  "dynamic": false},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                            "symmetric": true, "dynamic": true}}},
    "ignore": ["lm_head", "re:.*vision_tower.*"]})");
}

TEST(Fp8E4M3, EveryCodeRoundTripsAndKnownValuesDecode) {
  EXPECT_EQ(fp8e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0xff)));
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(Fp8E4M3, NarrowingRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);  // halfway between 1 and 1.125: to even (1)
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest: to 0
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: to even (2)
  EXPECT_EQ(f32_to_fp8e4m3(std::nanf("")), 0x7f);
}

TEST(QuantConfig, AbsentMeansUnquantizedAndEachMethodParses) {
  auto none = parse_quant_config(json::object());
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->method, QuantMethod::kNone);

  auto awq = parse(json::parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128,
      "zero_point": true, "version": "GEMM", "modules_to_not_convert": ["visual"]})"));
  ASSERT_TRUE(awq.is_ok()) << awq.status().to_string();
  EXPECT_EQ(awq->method, QuantMethod::kAwq);
  EXPECT_EQ(awq->group_rows(4096), 128);

  // AutoAWQ's own names for the same fields.
  auto awq_own = parse(json::parse(R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 64})"));
  ASSERT_TRUE(awq_own.is_ok()) << awq_own.status().to_string();
  EXPECT_EQ(awq_own->group_size, 64);

  auto gptq = parse(json::parse(R"({"quant_method": "gptq", "bits": 8, "group_size": -1,
      "sym": false, "desc_act": true, "checkpoint_format": "gptq_v2"})"));
  ASSERT_TRUE(gptq.is_ok()) << gptq.status().to_string();
  EXPECT_EQ(gptq->bits, 8);
  EXPECT_EQ(gptq->group_rows(4096), 4096);
  EXPECT_FALSE(gptq->symmetric);
  EXPECT_TRUE(gptq->act_order);
  EXPECT_FALSE(gptq->zeros_minus_one);

  auto fp8 = parse(fp8_config());
  ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
  EXPECT_EQ(fp8->method, QuantMethod::kFp8);
  EXPECT_EQ(fp8->weight_scale, ScaleStrategy::kChannel);
  EXPECT_TRUE(fp8->activations_quantized);
  EXPECT_TRUE(fp8->input_dynamic);

  json w8a16 = fp8_config();
  w8a16["format"] = "int-quantized";
  w8a16["config_groups"]["group_0"]["weights"]["type"] = "int";
  w8a16["config_groups"]["group_0"].erase("input_activations");
  auto int8 = parse(w8a16);
  ASSERT_TRUE(int8.is_ok()) << int8.status().to_string();
  EXPECT_EQ(int8->method, QuantMethod::kInt8);
  EXPECT_FALSE(int8->activations_quantized);

  json dense = fp8_config();
  dense["format"] = "dense";
  auto d = parse(dense);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->method, QuantMethod::kNone);
}

TEST(QuantConfig, UnsupportedLayoutsAreRefusedNamingTheField) {
  EXPECT_NE(parse_error({{"quant_method", "bitsandbytes"}}).find("quant_method"),
            std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "awq"}, {"version", "gemv"}}).find("version"),
            std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "awq"}, {"bits", 3}}).find("bits"), std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "awq"}, {"zero_point", false}}).find("zero_point"),
            std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "gptq"}, {"bits", 3}}).find("bits"), std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "gptq"}, {"checkpoint_format", "marlin"}})
                .find("checkpoint_format"),
            std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "gptq"}, {"lm_head", true}}).find("lm_head"),
            std::string::npos);
  EXPECT_NE(parse_error({{"quant_method", "gptq"}, {"group_size", 0}}).find("group_size"),
            std::string::npos);
  EXPECT_NE(
      parse_error({{"quant_method", "gptq"}, {"dynamic", {{"-:.*down_proj", {}}}}}).find("dynamic"),
      std::string::npos);
  auto upper = parse({{"quant_method", "gptq"}, {"checkpoint_format", "GPTQ_V2"}});
  ASSERT_TRUE(upper.is_ok());
  EXPECT_FALSE(upper->zeros_minus_one);
  // compressed-tensors checkpoints written before the key was renamed.
  auto legacy = parse_quant_config(json{{"compression_config", fp8_config()}});
  ASSERT_TRUE(legacy.is_ok());
  EXPECT_EQ(legacy->method, QuantMethod::kFp8);

  json packed = fp8_config();
  packed["format"] = "pack-quantized";
  EXPECT_NE(parse_error(packed).find("format"), std::string::npos);
  json group = fp8_config();
  group["config_groups"]["group_0"]["weights"]["strategy"] = "group";
  EXPECT_NE(parse_error(group).find("weights.strategy"), std::string::npos);
  json asym = fp8_config();
  asym["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  EXPECT_NE(parse_error(asym).find("weights.symmetric"), std::string::npos);
  json bits = fp8_config();
  bits["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  EXPECT_NE(parse_error(bits).find("weights.num_bits"), std::string::npos);
  json mixed = fp8_config();
  mixed["config_groups"]["group_0"]["input_activations"]["type"] = "int";
  EXPECT_NE(parse_error(mixed).find("input_activations.type"), std::string::npos);
  json two = fp8_config();
  two["config_groups"]["group_1"] = two["config_groups"]["group_0"];
  EXPECT_NE(parse_error(two).find("config_groups"), std::string::npos);
  json regex = fp8_config();
  regex["ignore"] = json::array({"re:(unclosed"});
  EXPECT_NE(parse_error(regex).find("ignore"), std::string::npos);
}

TEST(QuantConfig, IgnoredAndUnconvertedModulesStayDense) {
  auto fp8 = parse(fp8_config());
  ASSERT_TRUE(fp8.is_ok());
  EXPECT_TRUE(module_is_quantized(*fp8, "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(module_is_quantized(*fp8, "lm_head"));
  EXPECT_FALSE(module_is_quantized(*fp8, "model.vision_tower.encoder.layers.0.mlp.fc1"));
  auto awq = parse({{"quant_method", "awq"}, {"modules_to_not_convert", {"down_proj"}}});
  ASSERT_TRUE(awq.is_ok());
  EXPECT_FALSE(module_is_quantized(*awq, "model.layers.3.mlp.down_proj"));
  EXPECT_TRUE(module_is_quantized(*awq, "model.layers.3.mlp.up_proj"));
}

TEST(QuantConfig, SpecsRefuseShapesTheLayoutCannotPack) {
  auto awq = parse({{"quant_method", "awq"}, {"group_size", 128}});
  ASSERT_TRUE(awq.is_ok());
  EXPECT_FALSE(quantized_linear_specs(*awq, "m", 12, 256).is_ok());  // out % 8
  EXPECT_FALSE(quantized_linear_specs(*awq, "m", 16, 200).is_ok());  // in % group
  auto specs = quantized_linear_specs(*awq, "m", 16, 256);
  ASSERT_TRUE(specs.is_ok());
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].name, "m.qweight");
  EXPECT_EQ((*specs)[0].shapes.front(), (std::vector<int64_t>{256, 2}));
  EXPECT_EQ((*specs)[1].shapes.front(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*specs)[2].shapes.front(), (std::vector<int64_t>{2, 16}));
}

class QuantGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path dir = fs::path(test::source_dir()) / "tests/golden/quant";
    std::ifstream in(dir / "layouts.json");
    ASSERT_TRUE(in.good()) << "missing " << dir / "layouts.json";
    in >> listing_;
    auto mapped = MappedFile::open((dir / "layouts.safetensors").string());
    ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
    file_ = std::make_unique<MappedFile>(std::move(mapped).value());
    auto entries = parse_safetensors(*file_);
    ASSERT_TRUE(entries.is_ok()) << entries.status().to_string();
    for (auto& e : *entries) {
      TensorView v;
      v.name = e.name;
      v.dtype = e.dtype;
      v.shape = e.shape;
      v.data = file_->data() + e.offset_bytes;
      v.size_bytes = e.size_bytes;
      tensors_[e.name] = v;
    }
  }

  Result<TensorView> lookup(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return make_error(StatusCode::kNotFound, "no tensor '{}'", name);
    return it->second;
  }

  json listing_;
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
};

TEST_F(QuantGolden, EveryLayoutDequantizesBitForBitAsTheReferenceUnpacker) {
  ASSERT_GE(listing_["cases"].size(), 10u);
  for (const json& c : listing_["cases"]) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name);
    auto config = parse(c["quantization_config"]);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    ASSERT_TRUE(module_is_quantized(*config, name));
    const int64_t n = c["out_features"].get<int64_t>(), k = c["in_features"].get<int64_t>();
    auto specs = quantized_linear_specs(*config, name, n, k);
    ASSERT_TRUE(specs.is_ok()) << specs.status().to_string();
    for (const QuantTensorSpec& spec : *specs) {
      auto t = lookup(spec.name);
      if (!t.is_ok()) {
        EXPECT_TRUE(spec.optional) << spec.name;
        continue;
      }
      EXPECT_NE(std::find(spec.shapes.begin(), spec.shapes.end(), t->shape), spec.shapes.end())
          << spec.name;
      EXPECT_NE(std::find(spec.dtypes.begin(), spec.dtypes.end(), t->dtype), spec.dtypes.end())
          << spec.name;
    }
    auto got =
        dequantize_linear(*config, name, n, k, [this](const std::string& t) { return lookup(t); });
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    auto want_view = lookup(name + ".expected");
    ASSERT_TRUE(want_view.is_ok());
    const std::vector<float> want = want_view->to_f32();
    ASSERT_EQ(got->size(), want.size());
    size_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      differing += std::memcmp(&(*got)[i], &want[i], sizeof(float)) != 0;
    }
    EXPECT_EQ(differing, 0u) << "first: got " << (*got)[0] << " want " << want[0];
  }
}

// The integers the 4-bit GPU path keeps give the reference unpacker's weights, bit for bit, as
// float(code - zero) * scale; act-order, 8-bit and 8-bit-float layouts are refused.
TEST_F(QuantGolden, FourBitLayoutsUnpackToTheReferenceWeights) {
  int n_unpacked = 0;
  for (const json& c : listing_["cases"]) {
    const std::string name = c["case"].get<std::string>();
    SCOPED_TRACE(name);
    auto config = parse(c["quantization_config"]);
    ASSERT_TRUE(config.is_ok());
    const int64_t n = c["out_features"].get<int64_t>(), k = c["in_features"].get<int64_t>();
    auto q =
        unpack_int4_linear(*config, name, n, k, [this](const std::string& t) { return lookup(t); });
    const bool int4 = config->method == QuantMethod::kAwq ||
                      (config->method == QuantMethod::kGptq && config->bits == 4);
    if (!int4 || config->act_order) {
      ASSERT_FALSE(q.is_ok());
      EXPECT_EQ(q.status().code(), StatusCode::kUnsupported) << q.status().to_string();
      continue;
    }
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    ASSERT_EQ(q->n, n);
    ASSERT_EQ(q->k, k);
    const std::vector<float> want = lookup(name + ".expected")->to_f32();
    const int64_t groups = k / q->group;
    size_t differing = 0;
    for (int64_t col = 0; col < n; ++col) {
      for (int64_t row = 0; row < k; ++row) {
        const auto i = static_cast<size_t>(col * k + row);
        const auto g = static_cast<size_t>(col * groups + row / q->group);
        ASSERT_LE(q->codes[i], 15);
        const float w = static_cast<float>(q->codes[i] - q->zeros[g]) * q->scales[g];
        differing += std::memcmp(&w, &want[i], sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(differing, 0u);
    ++n_unpacked;
  }
  EXPECT_GE(n_unpacked, 4);  // AWQ twice, GPTQ 4-bit symmetric and asymmetric
}

TEST_F(QuantGolden, GptqGroupIndexOutsideTheScalesIsAnError) {
  const json* gptq = nullptr;
  for (const json& c : listing_["cases"]) {
    if (c["case"] == "gptq4_act_order") gptq = &c;
  }
  ASSERT_NE(gptq, nullptr);
  auto config = parse((*gptq)["quantization_config"]);
  ASSERT_TRUE(config.is_ok());
  std::vector<int32_t> bad(64, 0);
  bad[5] = 4;  // 64 rows in groups of 16: four groups, 0 to 3
  auto result = dequantize_linear(*config, "gptq4_act_order", 16, 64,
                                  [&](const std::string& t) -> Result<TensorView> {
                                    if (t != "gptq4_act_order.g_idx") return lookup(t);
                                    TensorView v = lookup(t).value();
                                    v.data = bad.data();
                                    return v;
                                  });
  ASSERT_FALSE(result.is_ok());
  EXPECT_NE(result.status().message().find("g_idx[5]"), std::string::npos)
      << result.status().message();
}

}  // namespace
}  // namespace litellama
