// litellama quantize round trips: a random float32 model quantized with each method loads,
// its projections dequantize close to the originals, it generates exactly as a dense float32
// model built from its dequantized weights, and its next-token distribution stays close to the
// unquantized model's (the KL divergence is printed per format).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "services/worker/calibration.h"
#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/offline_engine.h"
#include "services/worker/quantize.h"
#include "services/worker/safetensors.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A dense float32 checkpoint with `q`'s dequantized projections and its other tensors as stored.
void write_dequantized(const Checkpoint& q, const std::string& dir) {
  fs::create_directories(dir);
  std::vector<SafetensorsTensor> tensors;
  std::set<std::string> done;
  for (int32_t l = 0; l < q.config().n_layers; ++l) {
    const LayerTensorNames n = q.layer_names(l);
    for (const std::string* p : {&n.q, &n.k, &n.v, &n.o, &n.gate, &n.up, &n.down}) {
      auto w = q.linear_f32(*p);
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      const int64_t rows = *p == n.o || *p == n.down
                               ? q.config().hidden_size
                               : static_cast<int64_t>(w->size()) / q.config().hidden_size;
      const int64_t cols = static_cast<int64_t>(w->size()) / rows;
      std::vector<uint8_t> bytes(w->size() * sizeof(float));
      std::memcpy(bytes.data(), w->data(), bytes.size());
      tensors.push_back({*p, DType::kF32, {rows, cols}, std::move(bytes)});
      const std::string module = p->substr(0, p->size() - 7);
      for (const char* s :
           {".qweight", ".qzeros", ".scales", ".g_idx", ".weight", ".weight_scale"}) {
        done.insert(module + s);
      }
    }
  }
  for (const std::string& name : q.tensor_names()) {
    if (done.count(name)) continue;
    auto t = q.tensor(name);
    ASSERT_TRUE(t.is_ok());
    const auto* b = static_cast<const uint8_t*>(t->data);
    tensors.push_back({name, t->dtype, t->shape, std::vector<uint8_t>(b, b + t->size_bytes)});
  }
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).is_ok());
  auto text = read_text_file(q.dir() + "/config.json");
  ASSERT_TRUE(text.is_ok());
  json config = json::parse(*text);
  config.erase("quantization_config");
  std::ofstream(dir + "/config.json") << config.dump();
}

struct Generated {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<std::pair<int32_t, float>>> first_logits;  // every id of the vocabulary
};

Generated generate(const std::string& dir) {
  Generated g;
  auto ckpt = Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  if (!ckpt.is_ok()) return g;
  RunnerOptions options;
  options.n_kv_slots = 256;
  options.n_threads = 2;
  auto runner = create_model_runner(*ckpt, options);
  EXPECT_TRUE(runner.is_ok()) << runner.status().to_string();
  if (!runner.is_ok()) return g;
  OfflineEngine engine(**runner);
  std::vector<GenerationRequest> requests;
  for (const auto& prompt : std::vector<std::vector<int32_t>>{{9906, 1917}, {791, 6460, 374, 11}}) {
    GenerationRequest r;
    r.prompt_ids = prompt;
    r.max_new_tokens = 12;
    r.n_top_logits = ckpt->config().vocab_size;
    requests.push_back(r);
  }
  auto results = engine.generate(requests);
  EXPECT_TRUE(results.is_ok()) << results.status().to_string();
  if (!results.is_ok()) return g;
  for (const auto& r : *results) {
    g.ids.push_back(r.output_ids);
    g.first_logits.push_back(r.top_logits);
  }
  return g;
}

// KL(p || q) of the softmaxes of two full logit lists (any order of ids).
double kl_divergence(const std::vector<std::pair<int32_t, float>>& p_logits,
                     const std::vector<std::pair<int32_t, float>>& q_logits) {
  auto log_softmax = [](const std::vector<std::pair<int32_t, float>>& logits) {
    std::map<int32_t, double> out;
    double m = -INFINITY;
    for (const auto& [id, v] : logits) m = std::max(m, static_cast<double>(v));
    double sum = 0;
    for (const auto& [id, v] : logits) sum += std::exp(v - m);
    for (const auto& [id, v] : logits) out[id] = v - m - std::log(sum);
    return out;
  };
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (const auto& [id, l] : lp) kl += std::exp(l) * (l - lq.at(id));
  return kl;
}

// Four sequences of 48 ids drawn from a fixed seed: calibration input for the tiny models.
std::vector<std::vector<int32_t>> calibration_ids() {
  std::vector<std::vector<int32_t>> ids(4);
  uint64_t x = 88172645463325252ull;
  for (auto& seq : ids) {
    for (int i = 0; i < 48; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      seq.push_back(static_cast<int32_t>(x % 128000));
    }
  }
  return ids;
}

TEST(Quantize, RoundTripsGenerateAsTheirDequantizedWeightsAndStayNearTheOriginal) {
  test::TempDir tmp;
  test::make_model(tmp.sub("dense"), "llama3-tiny", 7);
  const Generated original = generate(tmp.sub("dense"));
  ASSERT_EQ(original.ids.size(), 2u);
  auto dense = Checkpoint::open(tmp.sub("dense"));
  ASSERT_TRUE(dense.is_ok());

  std::map<std::string, double> kl;
  for (const std::string method : {"gptq-rtn", "fp8", "awq", "w8a8"}) {
    SCOPED_TRACE(method);
    const std::string qdir = tmp.sub(method), ddir = tmp.sub(method + "-dequantized");
    const bool calibrated = method == "awq" || method == "w8a8";
    QuantizeOptions options;
    options.method = quantize_method_from_name(method).value();
    options.group_size = 32;
    if (calibrated) options.calibration_ids = calibration_ids();
    auto report = quantize_checkpoint(tmp.sub("dense"), qdir, options);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_EQ(report->modules, 2 * 7);
    EXPECT_LT(report->bytes_out, report->bytes_in);
    auto q = Checkpoint::open(qdir);
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    const std::map<std::string, QuantMethod> expected_method = {{"gptq-rtn", QuantMethod::kGptq},
                                                                {"fp8", QuantMethod::kFp8},
                                                                {"awq", QuantMethod::kAwq},
                                                                {"w8a8", QuantMethod::kInt8}};
    EXPECT_EQ(q->config().quant.method, expected_method.at(method));

    // Every projection within the quantizer's own error, and that error small against the
    // weights (the calibrated methods scale the weights first, so they are compared by output).
    double largest_error = 0, largest_weight = 0;
    for (int32_t l = 0; l < q->config().n_layers; ++l) {
      const LayerTensorNames n = q->layer_names(l);
      for (const std::string* p : {&n.q, &n.k, &n.v, &n.o, &n.gate, &n.up, &n.down}) {
        ASSERT_TRUE(q->is_quantized(*p));
        if (calibrated) continue;
        auto got = q->linear_f32(*p);
        auto want = dense->linear_f32(*p);
        ASSERT_TRUE(got.is_ok() && want.is_ok());
        ASSERT_EQ(got->size(), want->size());
        for (size_t i = 0; i < got->size(); ++i) {
          largest_error = std::max(largest_error, std::fabs(double{(*got)[i]} - (*want)[i]));
          largest_weight = std::max(largest_weight, std::fabs(double{(*want)[i]}));
        }
      }
    }
    if (!calibrated) {
      EXPECT_LE(largest_error, report->max_abs_error * (1 + 1e-6));
      EXPECT_LT(largest_error, (method == "fp8" ? 0.07 : 0.2) * largest_weight);
    }

    write_dequantized(*q, ddir);
    const Generated quantized = generate(qdir);
    const Generated reference = generate(ddir);
    ASSERT_EQ(quantized.ids.size(), 2u);
    EXPECT_EQ(quantized.ids, reference.ids);
    EXPECT_EQ(quantized.first_logits, reference.first_logits);
    double sum = 0;
    for (size_t r = 0; r < 2; ++r)
      sum += kl_divergence(original.first_logits[r], quantized.first_logits[r]);
    kl[method] = sum / 2;
    std::cout << "next-token KL(float32 || " << method << ") = " << kl[method] << "\n";
    EXPECT_TRUE(std::isfinite(kl[method]));
    EXPECT_GE(kl[method], 0.0);
  }
  // Eight bits per weight lose less than four.
  EXPECT_LT(kl["fp8"], kl["gptq-rtn"]);
  EXPECT_LT(kl["w8a8"], kl["awq"]);
}

TEST(Quantize, RefusesWhatItCannotDoSayingWhy) {
  test::TempDir tmp;
  test::make_model(tmp.sub("dense"), "llama3-tiny", 7);
  QuantizeOptions options;
  options.method = QuantizeMethod::kAwq;
  auto awq = quantize_checkpoint(tmp.sub("dense"), tmp.sub("awq"), options);
  ASSERT_FALSE(awq.is_ok());
  EXPECT_NE(awq.status().message().find("--calibration"), std::string::npos);
  options.calibration_ids = {{1, 2, 3}, {4, 130000}};  // an id past the vocabulary
  auto bad_ids = quantize_checkpoint(tmp.sub("dense"), tmp.sub("awq"), options);
  ASSERT_FALSE(bad_ids.is_ok());
  EXPECT_FALSE(fs::exists(tmp.sub("awq") + "/config.json"));
  options.calibration_ids.clear();
  EXPECT_FALSE(quantize_method_from_name("int3").is_ok());
  options.method = QuantizeMethod::kGptqRtn;
  options.group_size = 48;  // does not divide in_features 64
  auto bad = quantize_checkpoint(tmp.sub("dense"), tmp.sub("bad"), options);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("group size"), std::string::npos) << bad.status().message();
  options.method = QuantizeMethod::kAwq;  // refused before calibrating
  options.calibration_ids = calibration_ids();
  auto bad_awq = quantize_checkpoint(tmp.sub("dense"), tmp.sub("bad-awq"), options);
  ASSERT_FALSE(bad_awq.is_ok());
  EXPECT_NE(bad_awq.status().message().find("group size"), std::string::npos);
  options.method = QuantizeMethod::kGptqRtn;
  options.calibration_ids.clear();
  options.group_size = 32;
  ASSERT_TRUE(quantize_checkpoint(tmp.sub("dense"), tmp.sub("q"), options).is_ok());
  auto again = quantize_checkpoint(tmp.sub("q"), tmp.sub("q2"), options);
  ASSERT_FALSE(again.is_ok());
  EXPECT_NE(again.status().message().find("already quantized"), std::string::npos);
  auto over = quantize_checkpoint(tmp.sub("dense"), tmp.sub("q"), options);
  ASSERT_FALSE(over.is_ok());
  EXPECT_NE(over.status().message().find("already holds"), std::string::npos);
}

TEST(Quantize, MissingOrMisshapenQuantizedTensorsFailTheLoadNamingThem) {
  test::TempDir tmp;
  test::make_model(tmp.sub("dense"), "llama3-tiny", 7);
  QuantizeOptions options;
  options.group_size = 32;
  ASSERT_TRUE(quantize_checkpoint(tmp.sub("dense"), tmp.sub("q"), options).is_ok());
  // The same tensors under a config that promises another group size.
  auto text = read_text_file(tmp.sub("q") + "/config.json");
  ASSERT_TRUE(text.is_ok());
  json config = json::parse(*text);
  config["quantization_config"]["group_size"] = 16;
  std::ofstream(tmp.sub("q") + "/config.json") << config.dump();
  auto wrong = Checkpoint::open(tmp.sub("q"));
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("qzeros"), std::string::npos) << wrong.status().message();
}

// Groups whose minimum is near 0 (here: every weight of layer 0's q_proj made non-negative) would
// take zero point 0, which the original GPTQ format cannot store; they must still read back
// within the quantizer's error.
TEST(Quantize, GptqRtnGroupsWithoutNegativeWeightsReadBackAsQuantized) {
  test::TempDir tmp;
  test::make_model(tmp.sub("random"), "llama3-tiny", 7);
  auto random = Checkpoint::open(tmp.sub("random"));
  ASSERT_TRUE(random.is_ok());
  const std::string q0 = random->layer_names(0).q;
  std::vector<SafetensorsTensor> tensors;
  for (const std::string& name : random->tensor_names()) {
    auto t = random->tensor(name);
    ASSERT_TRUE(t.is_ok());
    ASSERT_EQ(t->dtype, DType::kF32);
    const auto* b = static_cast<const uint8_t*>(t->data);
    SafetensorsTensor out{name, t->dtype, t->shape, std::vector<uint8_t>(b, b + t->size_bytes)};
    if (name == q0) {
      auto* f = reinterpret_cast<float*>(out.data.data());
      for (size_t i = 0; i < out.data.size() / 4; ++i) f[i] = std::fabs(f[i]);
    }
    tensors.push_back(std::move(out));
  }
  fs::create_directories(tmp.sub("positive"));
  ASSERT_TRUE(write_safetensors(tmp.sub("positive") + "/model.safetensors", tensors).is_ok());
  fs::copy_file(tmp.sub("random") + "/config.json", tmp.sub("positive") + "/config.json");
  QuantizeOptions options;
  options.group_size = 32;
  auto report = quantize_checkpoint(tmp.sub("positive"), tmp.sub("q"), options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  auto q = Checkpoint::open(tmp.sub("q"));
  auto dense = Checkpoint::open(tmp.sub("positive"));
  ASSERT_TRUE(q.is_ok() && dense.is_ok());
  auto got = q->linear_f32(q0);
  auto want = dense->linear_f32(q0);
  ASSERT_TRUE(got.is_ok() && want.is_ok());
  double largest = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    largest = std::max(largest, std::fabs(double{(*got)[i]} - (*want)[i]));
  }
  EXPECT_LE(largest, report->max_abs_error * (1 + 1e-6));
  // Every stored zero point of that projection reads back as 1 to 15.
  auto qzeros = q->tensor(q0.substr(0, q0.size() - 7) + ".qzeros");
  ASSERT_TRUE(qzeros.is_ok());
  const auto* words = static_cast<const uint32_t*>(qzeros->data);
  for (int64_t i = 0; i < qzeros->numel(); ++i) {
    for (int nib = 0; nib < 8; ++nib) EXPECT_NE((words[i] >> (4 * nib)) & 0xfu, 0xfu) << i;
  }
}

// A per-row 3-bit round to nearest: coarse enough that scaling matters.
std::vector<float> coarse_quantize(const std::vector<float>& w, int64_t n, int64_t k) {
  std::vector<float> out(w.size());
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
    const float step = amax > 0 ? amax / 3 : 1;
    for (int64_t c = 0; c < k; ++c) out[r * k + c] = std::nearbyint(w[r * k + c] / step) * step;
  }
  return out;
}

double output_error(const InputStats& x, const std::vector<float>& w, int64_t n, int64_t k,
                    const std::vector<float>& s) {
  std::vector<float> ws(w.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) ws[r * k + c] = w[r * k + c] * s[c];
  }
  const std::vector<float> q = coarse_quantize(ws, n, k);
  double err = 0;
  for (int64_t t = 0; t < x.sample_rows; ++t) {
    for (int64_t r = 0; r < n; ++r) {
      double want = 0, got = 0;
      for (int64_t c = 0; c < k; ++c) {
        want += double{x.samples[t * k + c]} * w[r * k + c];
        got += double{x.samples[t * k + c]} / s[c] * q[r * k + c];
      }
      err += (got - want) * (got - want);
    }
  }
  return err;
}

TEST(Calibration, AwqScalesFavourTheLargeActivationChannelAndNeverLoseToNone) {
  constexpr int64_t n = 8, k = 16, rows = 32;
  std::vector<float> x(rows * k), w(n * k);
  uint32_t state = 12345;
  auto uniform = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / (1 << 24) * 2 - 1;
  };
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < k; ++c) x[t * k + c] = uniform() * (c == 3 ? 40.0f : 1.0f);
  }
  for (auto& v : w) v = uniform();
  InputStats stats;
  stats.add(x.data(), rows, k, rows);
  std::vector<float> weights = w;
  const std::vector<float> s = awq_search_scales(stats, {{&weights, n, k}}, k, coarse_quantize);
  ASSERT_EQ(s.size(), static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) {
    if (c != 3) EXPECT_GT(s[3], s[c]) << c;
  }
  const std::vector<float> none(k, 1.0f);
  EXPECT_LT(output_error(stats, w, n, k, s), output_error(stats, w, n, k, none));
}

TEST(Calibration, SmoothQuantScalesBalanceActivationRangeAndWeightRanges) {
  InputStats stats;
  const std::vector<float> x = {4.0f, -0.25f, 0.0f, 1.0f,  // two rows of four channels
                                0.0f, 0.25f,  0.0f, -1.0f};
  stats.add(x.data(), 2, 4, 2);
  std::vector<float> w = {1.0f,  4.0f, 2.0f, 0.0f,  // two outputs
                          -0.5f, 1.0f, 1.0f, 0.0f};
  const std::vector<float> s = smoothquant_scales(stats, {{&w, 2, 4}}, 0.5);
  EXPECT_FLOAT_EQ(s[0], 2.0f / std::sqrt(2.0f));  // sqrt(range 4) / sqrt(2 * 1)
  EXPECT_FLOAT_EQ(s[1], 0.25f);                   // sqrt(0.5) / sqrt(2 * 4)
  EXPECT_FLOAT_EQ(s[2], 1e-5f);                   // no activation range: the floor
  EXPECT_FLOAT_EQ(s[3], 2.0f);                    // no weight: the activation range
  scale_columns({{&w, 2, 4}}, s);
  EXPECT_FLOAT_EQ(w[0], 2.0f / std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(w[5], 0.25f);
}

}  // namespace
}  // namespace litellama
