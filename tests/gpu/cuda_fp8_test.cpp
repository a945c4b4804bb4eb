// FP8 weights on the GPU (kernels/linear_fp8.h): the dequantizing kernel and the per-token
// activation quantizer against the host's values bit for bit, the GEMV's conversion of every e4m3
// code exactly, the linear layer on each of its paths against a double-precision product (of the
// quantized activations where the FP8 GEMM quantizes them), and the CUDA runner on an FP8
// checkpoint written by `litellama quantize` against the CPU runner, which dequantizes it to
// float32 at load: float32 gives the CPU's greedy ids exactly, bf16 and fp16 stay within the
// tolerance stated below (activations quantized to e4m3 on the GEMM path), with and without CUDA
// graphs. Portable builds run the dequantizing path only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/add_rmsnorm.h"
#include "kernels/gpu_runtime.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/silu_mul.h"
#include "services/worker/cpu_model_runner.h"
#include "services/worker/quantize.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/runner_test_util.h"

namespace litellama {
namespace {

using namespace gpu_test;     // NOLINT(google-build-using-namespace)
using namespace runner_test;  // NOLINT(google-build-using-namespace)

uint8_t random_code(std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (;;) {
    const auto c = static_cast<uint8_t>(byte(rng));
    if ((c & 0x7f) != 0x7f) return c;  // not NaN
  }
}

// A random FP8 weight on the host and the device, and its dequantized values as `dtype` holds
// them: round_dtype(e4m3(code) * scale[col]).
struct Fp8Case {
  int32_t n, k;
  std::vector<uint8_t> codes;
  std::vector<float> scales, dense;
  DevBuf d_codes, d_scales;

  Fp8Case(int32_t n_, int32_t k_, DType dtype, std::mt19937& rng, bool unit_scales = false)
      : n(n_), k(k_) {
    codes.resize(static_cast<size_t>(n) * k);
    for (auto& c : codes) c = random_code(rng);
    // Codes reach 448: scales that keep weights around 1 / sqrt(k) on average.
    std::uniform_real_distribution<float> s(0.25f, 1.0f);
    scales.resize(static_cast<size_t>(n));
    for (auto& v : scales) v = unit_scales ? 1.0f : s(rng) / (64.0f * std::sqrt(float(k)));
    std::vector<float> f(codes.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = fp8e4m3_to_f32(codes[i]) * scales[i / k];
    std::vector<uint8_t> bytes(f.size() * dtype_size_bytes(dtype));
    convert_from_f32(bytes.data(), dtype, f.data(), f.size());
    dense.resize(f.size());
    convert_to_f32(dense.data(), bytes.data(), dtype, f.size());
    d_codes = upload(codes);
    d_scales = upload(scales);
  }

  Fp8Weight weight() const {
    return Fp8Weight{d_codes.as<const uint8_t>(), d_scales.as<const float>(), n, k};
  }
};

// The host's per-token quantization (launch_fp8_quantize_rows' contract).
void quantize_rows_on_host(const std::vector<float>& x, int32_t m, int32_t k,
                           std::vector<uint8_t>* q, std::vector<float>* scales) {
  q->resize(static_cast<size_t>(m) * k);
  scales->resize(static_cast<size_t>(m));
  for (int32_t r = 0; r < m; ++r) {
    float amax = 0;
    for (int32_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[size_t(r) * k + i]));
    const float scale = amax > 0 ? amax / kFp8E4m3Max : 1.0f;
    (*scales)[size_t(r)] = scale;
    for (int32_t i = 0; i < k; ++i) {
      (*q)[size_t(r) * k + i] = f32_to_fp8e4m3(x[size_t(r) * k + i] / scale);
    }
  }
}

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaFp8, DequantizeGivesTheHostValuesBitForBit) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(51);
  for (DType dtype : kDtypes) {
    for (auto [n, k] : {std::pair{8, 8}, std::pair{200, 1024}, std::pair{24, 200}}) {
      SCOPED_TRACE(testing::Message() << dtype_label(dtype) << " n " << n << " k " << k);
      const Fp8Case w(n, k, dtype, rng);
      DevBuf d_dense(w.dense.size() * dtype_size_bytes(dtype));
      LITELLAMA_ASSERT_OK(launch_fp8_dequantize(d_dense.get(), w.weight(), dtype, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got = download_as_f32(d_dense, w.dense.size(), dtype);
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] == w.dense[i] ? 0 : 1;
      EXPECT_EQ(differ, 0u);
    }
  }
}

TEST(CudaFp8, QuantizeRowsGivesTheHostCodesAndScales) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the FP8 activation quantizer");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(52);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (auto [m, k] : {std::pair{1, 8}, std::pair{7, 4096}, std::pair{33, 14336}}) {
      SCOPED_TRACE(testing::Message() << dtype_label(dtype) << " m " << m << " k " << k);
      Tensor x = random_tensor(static_cast<size_t>(m) * k, dtype, -3, 3, rng);
      // Row 0 all zeros (scale 1), and values across the e4m3 range's subnormals.
      std::fill(x.values.begin(), x.values.begin() + k, 0.0f);
      if (m > 1) x.values[size_t(k) + 1] = 1e-4f;
      convert_from_f32(x.bytes.data(), dtype, x.values.data(), x.values.size());
      convert_to_f32(x.values.data(), x.bytes.data(), dtype, x.values.size());
      std::vector<uint8_t> want_q;
      std::vector<float> want_s;
      quantize_rows_on_host(x.values, m, k, &want_q, &want_s);
      DevBuf d_x = upload(x.bytes), d_q(want_q.size()), d_s(want_s.size() * sizeof(float));
      LITELLAMA_ASSERT_OK(launch_fp8_quantize_rows(d_q.as<uint8_t>(), d_s.as<float>(), d_x.get(), m,
                                                   k, dtype, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<uint8_t> q(want_q.size());
      std::vector<float> s(want_s.size());
      LITELLAMA_ASSERT_CUDA(cudaMemcpy(q.data(), d_q.get(), q.size(), cudaMemcpyDeviceToHost));
      LITELLAMA_ASSERT_CUDA(
          cudaMemcpy(s.data(), d_s.get(), s.size() * sizeof(float), cudaMemcpyDeviceToHost));
      EXPECT_EQ(s, want_s);
      size_t differ = 0;
      for (size_t i = 0; i < q.size(); ++i) differ += q[i] == want_q[i] ? 0 : 1;
      EXPECT_EQ(differ, 0u);
    }
  }
}

// The norm and SiLU kernels that write e4m3 give the codes and scales of quantizing what their
// plain versions store, bit for bit (and the norm the same residual).
TEST(CudaFp8, FusedQuantizationEqualsTheUnfusedSequence) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the FP8 activation quantizer");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(55);
  auto download_bytes = [](const DevBuf& b, size_t n) {
    std::vector<uint8_t> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  };
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (auto [m, k] : {std::pair{3, 256}, std::pair{17, 4096}, std::pair{5, 14336}}) {
      SCOPED_TRACE(testing::Message() << dtype_label(dtype) << " m " << m << " k " << k);
      const size_t numel = static_cast<size_t>(m) * k, bytes = numel * dtype_size_bytes(dtype);
      const Tensor residual = random_tensor(numel, dtype, -2, 2, rng);
      const Tensor delta = random_tensor(numel, dtype, -1, 1, rng);
      const Tensor gate_up = random_tensor(2 * numel, dtype, -4, 4, rng);
      std::uniform_real_distribution<float> wd(0.5f, 1.5f);
      std::vector<float> weight(static_cast<size_t>(k));
      for (auto& w : weight) w = wd(rng);
      DevBuf d_w = upload(weight), d_delta = upload(delta.bytes), d_gu = upload(gate_up.bytes);
      DevBuf r1 = upload(residual.bytes), r2 = upload(residual.bytes), normed(bytes);
      DevBuf q1(numel), s1(m * sizeof(float)), q2(numel), s2(m * sizeof(float));
      LITELLAMA_ASSERT_OK(launch_add_rmsnorm(normed.get(), r1.get(), d_delta.get(),
                                             d_w.as<const float>(), m, k, 1e-5f, dtype, nullptr));
      LITELLAMA_ASSERT_OK(launch_fp8_quantize_rows(q1.as<uint8_t>(), s1.as<float>(), normed.get(),
                                                   m, k, dtype, nullptr));
      LITELLAMA_ASSERT_OK(launch_add_rmsnorm_fp8(q2.as<uint8_t>(), s2.as<float>(), r2.get(),
                                                 d_delta.get(), d_w.as<const float>(), m, k, 1e-5f,
                                                 dtype, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(download_bytes(q1, numel), download_bytes(q2, numel));
      EXPECT_EQ(download_bytes(s1, m * sizeof(float)), download_bytes(s2, m * sizeof(float)));
      EXPECT_EQ(download_bytes(r1, bytes), download_bytes(r2, bytes));

      DevBuf act(bytes);
      LITELLAMA_ASSERT_OK(launch_silu_mul(act.get(), d_gu.get(), m, k, dtype, nullptr));
      LITELLAMA_ASSERT_OK(launch_fp8_quantize_rows(q1.as<uint8_t>(), s1.as<float>(), act.get(), m,
                                                   k, dtype, nullptr));
      LITELLAMA_ASSERT_OK(
          launch_silu_mul_fp8(q2.as<uint8_t>(), s2.as<float>(), d_gu.get(), m, k, dtype, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(download_bytes(q1, numel), download_bytes(q2, numel));
      EXPECT_EQ(download_bytes(s1, m * sizeof(float)), download_bytes(s2, m * sizeof(float)));
    }
  }
}

// One-hot tokens pick single input rows: with unit scales, each output is one code's value,
// which both 16-bit types hold exactly. Every position of a 128-row slice and every code is met.
TEST(CudaFp8, GemvConvertsEveryCodeExactly) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the FP8 GEMV");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(53);
  constexpr int32_t n = 48, k = 256, m = kFp8GemvMaxRows;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_label(dtype));
    Fp8Case w(n, k, dtype, rng, /*unit_scales=*/true);
    for (size_t i = 0; i < 256; ++i) {  // every code, at rows spread over the slices
      if ((i & 0x7f) != 0x7f) w.codes[i * 47 % w.codes.size()] = static_cast<uint8_t>(i);
    }
    w.d_codes = upload(w.codes);
    for (size_t i = 0; i < w.codes.size(); ++i) w.dense[i] = fp8e4m3_to_f32(w.codes[i]);
    size_t wrong = 0;
    for (int32_t base = 0; base < k; base += m) {
      std::vector<float> x(static_cast<size_t>(m) * k, 0.0f);
      for (int32_t t = 0; t < m; ++t) x[size_t(t) * k + base + t] = 1.0f;
      std::vector<uint8_t> xb(x.size() * dtype_size_bytes(dtype));
      convert_from_f32(xb.data(), dtype, x.data(), x.size());
      DevBuf d_x = upload(xb), d_y(static_cast<size_t>(m) * n * dtype_size_bytes(dtype));
      ASSERT_EQ(fp8_linear_path(dtype, m, k, false), Fp8Path::kGemv);
      LITELLAMA_ASSERT_OK(launch_fp8_linear(d_y.get(), d_x.get(), w.weight(), m, dtype,
                                            Fp8Scratch{}, false, nullptr, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> y = download_as_f32(d_y, static_cast<size_t>(m) * n, dtype);
      for (int32_t t = 0; t < m; ++t) {
        for (int32_t c = 0; c < n; ++c) {
          wrong += y[size_t(t) * n + c] == w.dense[size_t(c) * k + base + t] ? 0 : 1;
        }
      }
    }
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(CudaFp8, LinearMatchesDoubleProductOnEachPath) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(54);
  LinearHandle handle = nullptr;
  LITELLAMA_ASSERT_OK(linear_handle_create(&handle));
  auto gemm = Fp8Gemm::create();
  EXPECT_EQ(gemm.is_ok(), fp8_gemm_available()) << gemm.status().to_string();
  // Tile-aligned and ragged column counts; k of one and many 128-row slices per warp, and 200
  // (no GEMV at any batch).
  const std::pair<int32_t, int32_t> shapes[] = {
      {16, 128}, {200, 1024}, {1000, 2048}, {24, 208}, {96, 4096}};
  for (DType dtype : kDtypes) {
    for (auto [n, k] : shapes) {
      const Fp8Case w(n, k, dtype, rng);
      DevBuf d_dense(static_cast<size_t>(n) * k * dtype_size_bytes(dtype));
      for (int32_t m : {1, 2, 5, 8, 9, 16, 17, 40, 100}) {
        DevBuf d_xq(static_cast<size_t>(m) * k), d_xs(static_cast<size_t>(m) * sizeof(float));
        Fp8Scratch scratch;
        scratch.xq = d_xq.as<uint8_t>();
        scratch.x_scales = d_xs.as<float>();
        scratch.dense = d_dense.get();
        DevBuf d_ws(size_t{32} << 20);
        scratch.gemm = gemm.is_ok() ? gemm->get() : nullptr;
        scratch.gemm_workspace = d_ws.get();
        scratch.gemm_workspace_bytes = size_t{32} << 20;
        const Fp8Path path = fp8_linear_path(dtype, m, k, scratch.gemm != nullptr);
        for (bool invariant : {false, true}) {
          if (invariant && dtype != DType::kF32) continue;
          SCOPED_TRACE(testing::Message()
                       << dtype_label(dtype) << " m " << m << " n " << n << " k " << k << " "
                       << fp8_path_name(path) << (invariant ? " tiled" : ""));
          const Tensor x = random_tensor(static_cast<size_t>(m) * k, dtype, -1, 1, rng);
          // The GEMM multiplies the quantized activations: its reference does too.
          std::vector<float> xr = x.values;
          if (path == Fp8Path::kGemm) {
            std::vector<uint8_t> q;
            std::vector<float> s;
            quantize_rows_on_host(x.values, m, k, &q, &s);
            for (size_t i = 0; i < xr.size(); ++i) xr[i] = fp8e4m3_to_f32(q[i]) * s[i / k];
          }
          DevBuf d_x = upload(x.bytes);
          const size_t numel = static_cast<size_t>(m) * n;
          DevBuf d_y((numel + n) * dtype_size_bytes(dtype));  // a poisoned row past m
          LITELLAMA_ASSERT_OK(launch_fp8_linear(d_y.get(), d_x.get(), w.weight(), m, dtype, scratch,
                                                invariant, handle, nullptr));
          LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
          const std::vector<float> y = download_as_f32(d_y, numel + n, dtype);
          const double tol = dtype == DType::kF32     ? 1e-5
                             : path == Fp8Path::kGemm ? 1e-2
                                                      : tolerance(dtype) / 2;
          double worst = 0;
          size_t bad = 0;
          for (int32_t i = 0; i < m; ++i) {
            for (int32_t j = 0; j < n; ++j) {
              double ref = 0;
              for (int32_t kk = 0; kk < k; ++kk) {
                ref += double{xr[size_t(i) * k + kk]} * w.dense[size_t(j) * k + kk];
              }
              const float out = y[size_t(i) * n + j];
              const double err = std::fabs(out - ref) / std::max(1.0, std::fabs(ref));
              worst = std::max(worst, std::isfinite(out) ? err : INFINITY);
              bad += std::isfinite(out) && err <= tol ? 0 : 1;
            }
          }
          EXPECT_EQ(bad, 0u) << "worst relative error " << worst << " (tol " << tol << ")";
          size_t written_past = 0;
          for (size_t i = numel; i < numel + n; ++i) written_past += std::isnan(y[i]) ? 0 : 1;
          EXPECT_EQ(written_past, 0u);
        }
      }
    }
  }
  if (gemm.is_ok()) {
    std::printf("[ FP8 GEMM ] cuBLASLt outer-vector scaling %s\n",
                (*gemm)->used_fallback() ? "not available: unscaled GEMM + scaling kernel"
                                         : "used for every shape");
  }
  linear_handle_destroy(handle);
}

// A two-layer llama3-tiny whose widths the GEMV takes (hidden 256, intermediate 640), and its FP8
// copy.
struct Fp8Models {
  TempDir dir{"fp8"};
  std::string dense() const { return dir.str() + "/dense"; }
  std::string quantized(const std::string& method) const { return dir.str() + "/" + method; }
};

Status write_models(const Fp8Models& m, QuantizeMethod method, const std::string& name) {
  LITELLAMA_ASSIGN_OR_RETURN(RandomCheckpointPreset preset,
                             find_random_checkpoint_preset("llama3-tiny"));
  nlohmann::json config = preset.config;
  config["hidden_size"] = 256;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["head_dim"] = 64;
  config["intermediate_size"] = 640;
  config["num_hidden_layers"] = 2;
  RandomCheckpointOptions options;
  options.seed = 19;
  options.storage_dtype = DType::kBF16;
  LITELLAMA_RETURN_IF_ERROR(write_random_checkpoint(m.dense(), config, options));
  QuantizeOptions q;
  q.method = method;
  if (method == QuantizeMethod::kW8a8) q.calibration_ids = {{1, 2, 3, 4, 5, 6, 7, 8}};
  return quantize_checkpoint(m.dense(), m.quantized(name), q).status();
}

// bf16 / fp16 logits against the float32 CPU runner, relative to the top logit: the e4m3
// activations of the GEMM path (relative rounding up to 2^-4 per element) dominate.
constexpr double kFp8RunnerTolerance = 0.1;

TEST(CudaFp8, Fp8CheckpointMatchesTheCpuRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  Fp8Models models;
  LITELLAMA_ASSERT_OK(write_models(models, QuantizeMethod::kFp8, "fp8"));
  auto ckpt = Checkpoint::open(models.quantized("fp8"));
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto options = [](Device device, DType dtype) {
    RunnerOptions o = runner_options(device, dtype);
    o.max_batch_seqs = 32;
    return o;
  };
  auto cpu = create_cpu_model_runner(*ckpt, options(Device::kCpu, DType::kF32));
  LITELLAMA_ASSERT_OK(cpu.status());
  std::mt19937 rng(29);
  const int32_t n_new = 10;
  // 20 sequences (prefill and decode steps of 20 rows: the GEMM path), then 5 (decode on the
  // GEMV).
  std::vector<int32_t> lens;
  for (int i = 0; i < 20; ++i) lens.push_back(1 + (i * 7) % 40);
  for (const std::vector<int32_t>& prompt_lens : {lens, std::vector<int32_t>{3, 60, 1, 17, 9}}) {
    const auto requests =
        make_requests(prompt_lens, n_new, ckpt->config().vocab_size, (*cpu)->n_kv_slots(), rng);
    const std::vector<int32_t> together(requests.size(), 0);
    auto want = generate(**cpu, requests, n_new, together);
    LITELLAMA_ASSERT_OK(want.status());

    auto f32 =
        generate_on_cuda(*ckpt, options(Device::kCuda, DType::kF32), requests, n_new, together);
    LITELLAMA_ASSERT_OK(f32.status());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(f32->ids[i], want->ids[i]) << "float32, request " << i;
      for (size_t s = 0; s < want->tops[i].size(); ++s) {
        EXPECT_TRUE(tops_close(f32->tops[i][s], want->tops[i][s], 1e-4))
            << "float32, request " << i << " step " << s;
      }
    }
    std::printf("[ fp8, %zu requests ] float32 CUDA vs CPU: max top-logit relative diff %.3g\n",
                requests.size(), max_rel_diff(*f32, *want));

    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (bool graphs : {true, false}) {
        SCOPED_TRACE(testing::Message() << dtype_label(dtype) << (graphs ? " graphs" : ""));
        RunnerOptions o = options(Device::kCuda, dtype);
        o.use_cuda_graphs = graphs;
        auto got = generate_on_cuda(*ckpt, o, requests, n_new, together);
        LITELLAMA_ASSERT_OK(got.status());
        const double tol = kFp8RunnerTolerance;
        size_t same = 0, total = 0;
        for (size_t i = 0; i < requests.size(); ++i) {
          for (size_t s = 0; s < want->tops[i].size(); ++s) {
            EXPECT_TRUE(tops_close(got->tops[i][s], want->tops[i][s], tol))
                << "request " << i << " step " << s;
            ++total;
            if (got->ids[i][s] == want->ids[i][s]) {
              ++same;
              continue;
            }
            const TopLogits& w = want->tops[i][s];
            double scale = 0;
            for (const auto& [id, v] : w) scale = std::max(scale, std::fabs(double{v}));
            EXPECT_LE(w[0].second - w[1].second, 2 * tol * scale)
                << "request " << i << " step " << s << ": ids differ without a near tie";
            break;
          }
        }
        std::printf(
            "[ fp8, %zu requests ] %s%s CUDA vs float32 CPU: max relative diff %.3g, greedy "
            "ids equal %zu / %zu steps before any divergence\n",
            requests.size(), dtype_label(dtype), graphs ? " (graphs)" : "",
            max_rel_diff(*got, *want), same, total);
      }
    }
  }
}

TEST(CudaFp8, Int8CheckpointsAreRefusedNamingTheFormat) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  Fp8Models models;
  LITELLAMA_ASSERT_OK(write_models(models, QuantizeMethod::kW8a8, "w8a8"));
  auto ckpt = Checkpoint::open(models.quantized("w8a8"));
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto cuda = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kBF16));
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(cuda.status().message().find("int8"), std::string::npos) << cuda.status().to_string();
}

}  // namespace
}  // namespace litellama
