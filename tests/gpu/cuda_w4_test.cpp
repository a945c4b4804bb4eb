// 4-bit weights on the GPU (kernels/linear_w4.h): the dequantizing kernel against the host's
// values bit for bit, the linear layer (small-batch W4 GEMV, dequantize + cuBLAS, dequantize +
// tiled kernel) against a double-precision product of the same dequantized weights, and the CUDA
// runner on AWQ and GPTQ checkpoints written by `litellama quantize` against the CPU runner, which
// dequantizes them to float32 at load: float32 gives the CPU's greedy ids exactly, bf16 and fp16
// stay within their tolerance over decode steps of 1 to 20 sequences (both kernels), with and
// without CUDA graphs. Portable builds run all of it on the dequantizing path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "kernels/linear.h"
#include "kernels/linear_w4.h"
#include "services/worker/cpu_model_runner.h"
#include "services/worker/quantize.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/runner_test_util.h"

namespace litellama {
namespace {

using namespace gpu_test;     // NOLINT(google-build-using-namespace)
using namespace runner_test;  // NOLINT(google-build-using-namespace)

// A random 4-bit weight on the host and the device, and its dequantized values as the compute
// dtype holds them.
struct W4Case {
  int32_t n, k, group;
  std::vector<uint8_t> codes, zeros;
  std::vector<float> scales;  // as stored in `dtype` (rounded), read back as float
  std::vector<float> dense;   // [n, k]: round_dtype(float(code - zero) * scale)
  DevBuf d_codes, d_zeros, d_scales;

  W4Case(int32_t n_, int32_t k_, int32_t group_, DType dtype, std::mt19937& rng)
      : n(n_), k(k_), group(group_) {
    const int32_t groups = k / group;
    std::uniform_int_distribution<int> code(0, 15), zero(0, 16);  // GPTQ's zero points reach 16
    codes.resize(static_cast<size_t>(n) * k);
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    zeros.resize(static_cast<size_t>(n) * groups);
    for (auto& z : zeros) z = static_cast<uint8_t>(zero(rng));
    const float amp = 0.5f / (8.0f * std::sqrt(static_cast<float>(k)));
    const Tensor s = random_tensor(static_cast<size_t>(n) * groups, dtype, amp / 4, amp, rng);
    scales = s.values;
    std::vector<float> f(static_cast<size_t>(n) * k);
    for (int32_t col = 0; col < n; ++col) {
      for (int32_t row = 0; row < k; ++row) {
        const size_t g = static_cast<size_t>(col) * groups + row / group;
        const size_t i = static_cast<size_t>(col) * k + row;
        f[i] = static_cast<float>(codes[i] - zeros[g]) * scales[g];
      }
    }
    std::vector<uint8_t> bytes(f.size() * dtype_size_bytes(dtype));
    convert_from_f32(bytes.data(), dtype, f.data(), f.size());
    dense.resize(f.size());
    convert_to_f32(dense.data(), bytes.data(), dtype, f.size());
    std::vector<uint32_t> words(static_cast<size_t>(n) * k / 8);
    pack_w4_codes(codes.data(), n, k, words.data());
    d_codes = upload(words);
    d_zeros = upload(zeros);
    d_scales = upload(s.bytes);
  }

  W4Weight weight() const {
    return W4Weight{
        d_codes.as<const uint32_t>(), d_zeros.as<const uint8_t>(), d_scales.get(), n, k, group};
  }
};

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaW4, DequantizeGivesTheHostValuesBitForBit) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(41);
  for (DType dtype : kDtypes) {
    for (auto [n, k, group] :
         {std::tuple{8, 8, 8}, std::tuple{48, 256, 32}, std::tuple{200, 1024, 128},
          std::tuple{24, 200, 40}, std::tuple{64, 512, 512}}) {
      SCOPED_TRACE(testing::Message()
                   << dtype_label(dtype) << " n " << n << " k " << k << " group " << group);
      const W4Case w(n, k, group, dtype, rng);
      DevBuf d_dense(w.dense.size() * dtype_size_bytes(dtype));
      LITELLAMA_ASSERT_OK(launch_w4_dequantize(d_dense.get(), w.weight(), dtype, nullptr));
      LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got = download_as_f32(d_dense, w.dense.size(), dtype);
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] == w.dense[i] ? 0 : 1;
      EXPECT_EQ(differ, 0u);
    }
  }
}

TEST(CudaW4, LinearMatchesDoubleProductOfTheDequantizedWeights) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(42);
  LinearHandle handle = nullptr;
  LITELLAMA_ASSERT_OK(linear_handle_create(&handle));
  struct Shape {
    int32_t n, k, group;
  };
  // Tile-aligned and ragged column counts (n % 16 != 0), one and many 128-row slices per warp,
  // groups of 32 to all of k; 24 x 200 (groups of 40) is not a GEMV shape at any batch.
  const Shape shapes[] = {{16, 128, 32},    {200, 1024, 128}, {1000, 2048, 64},
                          {4104, 512, 512}, {24, 200, 40},    {96, 4096, 128}};
  for (DType dtype : kDtypes) {
    for (Shape s : shapes) {
      const W4Case w(s.n, s.k, s.group, dtype, rng);
      DevBuf d_workspace(static_cast<size_t>(s.n) * s.k * dtype_size_bytes(dtype));
      for (int32_t m : {1, 2, 5, 8, 9, 16, 17, 40}) {
        for (bool invariant : {false, true}) {
          if (invariant && dtype != DType::kF32) continue;
          SCOPED_TRACE(testing::Message()
                       << dtype_label(dtype) << " m " << m << " n " << s.n << " k " << s.k
                       << " group " << s.group << (invariant ? " tiled" : ""));
          const Tensor x = random_tensor(static_cast<size_t>(m) * s.k, dtype, -1, 1, rng);
          DevBuf d_x = upload(x.bytes);
          // One row more than m, poisoned: nothing may be written past row m - 1.
          const size_t numel = static_cast<size_t>(m) * s.n;
          DevBuf d_y((numel + s.n) * dtype_size_bytes(dtype));
          LITELLAMA_ASSERT_OK(launch_w4_linear(d_y.get(), d_x.get(), w.weight(), m, dtype,
                                               d_workspace.get(), invariant, handle, nullptr));
          LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
          const std::vector<float> y = download_as_f32(d_y, numel + s.n, dtype);
          double worst = 0;
          size_t bad = 0;
          const double tol = dtype == DType::kF32 ? 1e-5 : tolerance(dtype) / 2;
          for (int32_t i = 0; i < m; ++i) {
            for (int32_t j = 0; j < s.n; ++j) {
              double ref = 0;
              for (int32_t kk = 0; kk < s.k; ++kk) {
                ref += static_cast<double>(x.values[static_cast<size_t>(i) * s.k + kk]) *
                       w.dense[static_cast<size_t>(j) * s.k + kk];
              }
              const float out = y[static_cast<size_t>(i) * s.n + j];
              const double err = std::fabs(out - ref) / std::max(1.0, std::fabs(ref));
              worst = std::max(worst, std::isfinite(out) ? err : INFINITY);
              bad += std::isfinite(out) && err <= tol ? 0 : 1;
            }
          }
          EXPECT_EQ(bad, 0u) << "worst relative error " << worst << " (tol " << tol << "), "
                             << (w4_gemv_supports(dtype, m, s.k, s.group) ? "GEMV" : "dequantize");
          size_t written_past = 0;
          for (size_t i = numel; i < numel + s.n; ++i) written_past += std::isnan(y[i]) ? 0 : 1;
          EXPECT_EQ(written_past, 0u);
        }
      }
    }
  }
  linear_handle_destroy(handle);
}

TEST(CudaW4, GemvTakesTheDecodeBatchesOfCudaBuilds) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the W4 GEMV");
  for (int32_t m = 1; m <= kW4GemvMaxRows; ++m) {
    EXPECT_TRUE(w4_gemv_supports(DType::kBF16, m, 4096, 128));
    EXPECT_TRUE(w4_gemv_supports(DType::kF16, m, 14336, 32));
  }
  EXPECT_FALSE(w4_gemv_supports(DType::kBF16, kW4GemvMaxRows + 1, 4096, 128));
  EXPECT_FALSE(w4_gemv_supports(DType::kF32, 1, 4096, 128));
  EXPECT_FALSE(w4_gemv_supports(DType::kBF16, 1, 4160, 64));  // k not a multiple of 128
  EXPECT_FALSE(w4_gemv_supports(DType::kBF16, 1, 4096, 16));  // groups of fewer than 32 rows
}

// A two-layer llama3-tiny whose widths the W4 GEMV takes (hidden 256, intermediate 640), and its
// quantized copies.
struct QuantizedModels {
  TempDir dir{"w4"};
  std::string dense() const { return dir.str() + "/dense"; }
  std::string quantized(const std::string& method) const { return dir.str() + "/" + method; }
};

Status write_quantized_models(const QuantizedModels& m) {
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
  options.seed = 17;
  options.storage_dtype = DType::kBF16;
  LITELLAMA_RETURN_IF_ERROR(write_random_checkpoint(m.dense(), config, options));
  for (const std::string method : {"gptq-rtn", "awq"}) {
    QuantizeOptions q;
    LITELLAMA_ASSIGN_OR_RETURN(q.method, quantize_method_from_name(method));
    q.group_size = method == "awq" ? 64 : 128;
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> id(0, 127999);
    q.calibration_ids.resize(3);
    for (auto& seq : q.calibration_ids) {
      for (int i = 0; i < 40; ++i) seq.push_back(id(rng));
    }
    LITELLAMA_RETURN_IF_ERROR(quantize_checkpoint(m.dense(), m.quantized(method), q).status());
  }
  return Status::ok();
}

TEST(CudaW4, QuantizedCheckpointsMatchTheCpuRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  QuantizedModels models;
  LITELLAMA_ASSERT_OK(write_quantized_models(models));
  for (const std::string method : {"gptq-rtn", "awq"}) {
    SCOPED_TRACE(method);
    auto ckpt = Checkpoint::open(models.quantized(method));
    LITELLAMA_ASSERT_OK(ckpt.status());
    // Up to 20 sequences per step.
    auto options = [](Device device, DType dtype) {
      RunnerOptions o = runner_options(device, dtype);
      o.max_batch_seqs = 32;
      return o;
    };
    auto cpu = create_cpu_model_runner(*ckpt, options(Device::kCpu, DType::kF32));
    LITELLAMA_ASSERT_OK(cpu.status());
    std::mt19937 rng(23);
    const int32_t n_new = 10;
    // 20 sequences, whose prefill and decode steps (20 rows) take the dequantizing path, then 5,
    // whose decode steps take the GEMV in 16-bit builds.
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
      std::printf("[ %s, %zu requests ] float32 CUDA vs CPU: max top-logit relative diff %.3g\n",
                  method.c_str(), requests.size(), max_rel_diff(*f32, *want));

      for (DType dtype : {DType::kBF16, DType::kF16}) {
        for (bool graphs : {true, false}) {
          SCOPED_TRACE(testing::Message() << dtype_label(dtype) << (graphs ? " graphs" : ""));
          RunnerOptions o = options(Device::kCuda, dtype);
          o.use_cuda_graphs = graphs;
          auto got = generate_on_cuda(*ckpt, o, requests, n_new, together);
          LITELLAMA_ASSERT_OK(got.status());
          const double tol = dtype == DType::kBF16 ? 4e-2 : 8e-3;
          // Step by step until the greedy ids part, which must be at a near tie of the CPU's
          // top two (the contexts differ from there on).
          for (size_t i = 0; i < requests.size(); ++i) {
            for (size_t s = 0; s < want->tops[i].size(); ++s) {
              EXPECT_TRUE(tops_close(got->tops[i][s], want->tops[i][s], tol))
                  << "request " << i << " step " << s;
              if (got->ids[i][s] == want->ids[i][s]) continue;
              const TopLogits& w = want->tops[i][s];
              double scale = 0;
              for (const auto& [id, v] : w) scale = std::max(scale, std::fabs(double{v}));
              EXPECT_LE(w[0].second - w[1].second, 2 * tol * scale)
                  << "request " << i << " step " << s << ": ids differ without a near tie";
              break;
            }
          }
          std::printf("[ %s, %zu requests ] %s%s CUDA vs float32 CPU: max relative diff %.3g\n",
                      method.c_str(), requests.size(), dtype_label(dtype),
                      graphs ? " (graphs)" : "", max_rel_diff(*got, *want));
        }
      }
    }
  }
}

}  // namespace
}  // namespace litellama
