// The CUDA model runner against the CPU runner (the reference semantics) on small random
// checkpoints of every supported graph: float32 must give exactly the CPU's greedy tokens and its
// top logits within 1e-4 relative; bf16/fp16 within their tolerance; a request alone and the same
// request inside a mixed prefill + decode batch give the same float32 outputs. Also refusals of
// unsupported shapes, and (disabled by default) the decode step time of a Llama-3.2-1B shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "kernels/gemv.h"
#include "kernels/gpu_runtime.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cpu_model_runner.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/model_runner.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/runner_test_util.h"

namespace litellama {
namespace {

// The runner tests' shared helpers (generation, requests, top-logit comparisons).
using namespace runner_test;  // NOLINT(google-build-using-namespace)

// A test model: a random-checkpoint preset reshaped to its head size (64 unless stated: the tuned
// attention kernels' size), two layers.
struct ModelCase {
  std::string preset;
  int32_t n_heads, n_kv_heads, hidden;
  int32_t intermediate = 0;  // 0: 2 * hidden + 64
  int32_t head_dim = 64;
};

const ModelCase kModels[] = {
    {"llama3-tiny", 4, 2, 256},          // llama3 RoPE, tied embeddings, GQA 2
    {"llama3-untied-tiny", 8, 1, 512},   // plain RoPE, untied, GQA 8
    {"llama2-linear-tiny", 4, 4, 256},   // MHA, linear RoPE
    {"llama2-dynamic-tiny", 4, 4, 256},  // dynamic NTK past a 32-token context
    {"mistral-tiny", 4, 1, 256},         // GQA 4
    {"qwen2-tiny", 4, 2, 256},           // q/k/v bias
    {"qwen2-yarn-tiny", 4, 2, 256},      // YaRN (attention factor on cos/sin)
    {"qwen3-tiny", 4, 2, 128},           // q/k RMSNorm, head_dim * heads != hidden
    // The general attention path: every other head size, each with another group ratio.
    // Query widths that are a multiple of 64 take the GEMV layers; 7 x 96 and 7 x 16 do not.
    {"hd16-tiny", 7, 1, 128, 0, 16},
    {"hd32-tiny", 6, 2, 192, 0, 32},
    {"hd48-tiny", 4, 4, 128, 0, 48},
    {"hd80-tiny", 4, 1, 128, 0, 80},  // q/k/v bias
    {"hd96-tiny", 7, 1, 448, 0, 96},
    {"hd256-tiny", 4, 2, 128, 0, 256},  // q/k RMSNorm
};

Result<Checkpoint> make_checkpoint(const TempDir& dir, const ModelCase& m, DType storage,
                                   uint64_t seed, int32_t head_dim = 0) {
  if (head_dim == 0) head_dim = m.head_dim;
  LITELLAMA_ASSIGN_OR_RETURN(RandomCheckpointPreset preset,
                             find_random_checkpoint_preset(m.preset));
  nlohmann::json config = preset.config;
  config["hidden_size"] = m.hidden;
  config["num_attention_heads"] = m.n_heads;
  config["num_key_value_heads"] = m.n_kv_heads;
  config["head_dim"] = head_dim;
  config["intermediate_size"] = m.intermediate > 0 ? m.intermediate : 2 * m.hidden + 64;
  config["num_hidden_layers"] = 2;
  RandomCheckpointOptions options;
  options.seed = seed;
  options.storage_dtype = storage;
  LITELLAMA_RETURN_IF_ERROR(write_random_checkpoint(dir.str(), config, options));
  return Checkpoint::open(dir.str());
}

// A fast path (graphs and direct launches) against the reference path: graphs and direct
// launches agree exactly; top logits are within tol of the reference until the first step where
// the greedy ids differ, which must be a near tie of the reference's top two (the contexts differ
// from there on). Returns the number of steps compared with the reference.
int32_t expect_fast_path_matches(const Trace& got, const Trace& got_direct, const Trace& want,
                                 double tol) {
  int32_t compared = 0;
  for (size_t i = 0; i < want.ids.size(); ++i) {
    EXPECT_EQ(got.ids[i], got_direct.ids[i]) << "request " << i;
    for (size_t s = 0; s < got.tops[i].size(); ++s) {
      EXPECT_TRUE(tops_close(got.tops[i][s], got_direct.tops[i][s], 1e-6))
          << "graphs vs direct, request " << i << " step " << s;
    }
    for (size_t s = 0; s < want.tops[i].size(); ++s) {
      EXPECT_TRUE(tops_close(got.tops[i][s], want.tops[i][s], tol))
          << "request " << i << " step " << s;
      ++compared;
      if (got.ids[i][s] != want.ids[i][s]) {
        const TopLogits& w = want.tops[i][s];
        double scale = 0;
        for (const auto& [id, v] : w) scale = std::max(scale, std::fabs(static_cast<double>(v)));
        EXPECT_LE(w[0].second - w[1].second, 2 * tol * scale)
            << "request " << i << " step " << s << ": greedy ids differ without a near tie";
        break;
      }
    }
  }
  return compared;
}

// A CUDA runner with direct launches and one with CUDA graphs over the same checkpoint, for
// tests that the graph runner returns what direct launches return.
struct DirectAndGraphRunners {
  std::unique_ptr<ModelRunner> direct;
  std::unique_ptr<ModelRunner> graphs;
};

void make_direct_and_graph_runners(const Checkpoint& ckpt, DType dtype,
                                   DirectAndGraphRunners* out) {
  RunnerOptions direct_options = runner_options(Device::kCuda, dtype);
  direct_options.use_cuda_graphs = false;
  auto direct = create_cuda_model_runner(ckpt, direct_options);
  LITELLAMA_ASSERT_OK(direct.status());
  auto graphs = create_cuda_model_runner(ckpt, runner_options(Device::kCuda, dtype));
  LITELLAMA_ASSERT_OK(graphs.status());
  out->direct = std::move(direct).value();
  out->graphs = std::move(graphs).value();
}

// Sequences a test drives step by step: sequence s starts with n_prompt ids
// (mul_seq * s + mul_pos * i + add) % vocab in slots 64 * s + i, and each id it is given next
// takes the next slot.
struct SteppedSequences {
  SteppedSequences(int32_t n_seqs, int32_t n_prompt, int32_t vocab, int32_t mul_seq,
                   int32_t mul_pos, int32_t add)
      : n_prompt(n_prompt), tokens(n_seqs), slots(n_seqs) {
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t i = 0; i < n_prompt; ++i) {
        tokens[s].push_back((mul_seq * s + mul_pos * i + add) % vocab);
        slots[s].push_back(64 * s + i);
      }
    }
  }
  // Adds sequence s's ids of step `step` to batch: the prompt at step 0, then its last id; with
  // `history`, its penalty history too (the prompt, then what came after).
  void add(StepBatch& batch, int32_t s, int32_t step, const SamplingParams& params,
           bool history) const {
    const std::span<const int32_t> fresh =
        step == 0 ? std::span<const int32_t>(tokens[s]) : std::span(&tokens[s].back(), 1);
    batch.add_sequence(fresh, slots[s], true, params, step);
    if (history) {
      const std::span<const int32_t> all(tokens[s]);
      batch.set_history(all.first(n_prompt), all.subspan(n_prompt));
    }
  }
  // Gives every sequence its next id.
  void append(const std::vector<int32_t>& next_ids) {
    for (size_t s = 0; s < tokens.size(); ++s) {
      tokens[s].push_back(next_ids[s]);
      slots[s].push_back(64 * static_cast<int32_t>(s) + static_cast<int32_t>(slots[s].size()));
    }
  }

  int32_t n_prompt;
  std::vector<std::vector<int32_t>> tokens, slots;
};

class CudaModelRunnerTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CudaModelRunnerTest, Float32MatchesCpuRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase& m = GetParam();
  TempDir dir(m.preset + "_f32");
  auto ckpt = make_checkpoint(dir, m, DType::kF32, 7);
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto cpu = create_cpu_model_runner(*ckpt, runner_options(Device::kCpu, DType::kF32));
  LITELLAMA_ASSERT_OK(cpu.status());
  auto cuda = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kF32));
  LITELLAMA_ASSERT_OK(cuda.status());

  std::mt19937 rng(21);
  const int32_t n_new = 12;
  // Mixed prompt lengths (1 and 70 cross the dynamic/YaRN 32-token original contexts).
  const auto requests =
      make_requests({1, 7, 70, 19}, n_new, ckpt->config().vocab_size, (*cpu)->n_kv_slots(), rng);
  const std::vector<int32_t> together(requests.size(), 0);
  auto want = generate(**cpu, requests, n_new, together);
  LITELLAMA_ASSERT_OK(want.status());
  auto got = generate(**cuda, requests, n_new, together);
  LITELLAMA_ASSERT_OK(got.status());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got->ids[i], want->ids[i]) << "request " << i;
    for (size_t s = 0; s < want->tops[i].size(); ++s) {
      EXPECT_TRUE(tops_close(got->tops[i][s], want->tops[i][s], 1e-4))
          << "request " << i << " step " << s;
    }
  }
  std::printf("[ %s ] float32 CUDA vs CPU: max top-logit relative difference %.3g\n",
              m.preset.c_str(), max_rel_diff(*got, *want));

  // The same requests started at different steps: prefill chunks share steps with decode tokens.
  auto mixed = generate(**cuda, requests, n_new, {0, 0, 2, 3});
  LITELLAMA_ASSERT_OK(mixed.status());
  auto alone_2 = generate(**cuda, {requests[2]}, n_new, {0});
  LITELLAMA_ASSERT_OK(alone_2.status());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(mixed->ids[i], got->ids[i]) << "request " << i << " in a mixed batch";
    for (size_t s = 0; s < got->tops[i].size(); ++s) {
      EXPECT_TRUE(tops_close(mixed->tops[i][s], got->tops[i][s], 1e-5))
          << "request " << i << " step " << s;
    }
  }
  EXPECT_EQ(alone_2->ids[0], got->ids[2]);
  std::printf(
      "[ %s ] float32 mixed batch vs together: max relative difference %.3g; alone vs "
      "together %.3g\n",
      m.preset.c_str(), max_rel_diff(*mixed, *got),
      max_rel_diff(*alone_2, Trace{{got->ids[2]}, {got->tops[2]}}));
}

TEST_P(CudaModelRunnerTest, HalfPrecisionWithinTolerance) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase& m = GetParam();
  TempDir dir(m.preset + "_bf16");
  // bf16 storage: both runners start from identical weights; only activation rounding differs.
  auto ckpt = make_checkpoint(dir, m, DType::kBF16, 8);
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto cpu = create_cpu_model_runner(*ckpt, runner_options(Device::kCpu, DType::kF32));
  LITELLAMA_ASSERT_OK(cpu.status());
  std::mt19937 rng(22);
  const auto requests =
      make_requests({5, 40, 1}, 1, ckpt->config().vocab_size, (*cpu)->n_kv_slots(), rng);
  const std::vector<int32_t> together(requests.size(), 0);
  auto want = generate(**cpu, requests, 1, together);
  LITELLAMA_ASSERT_OK(want.status());
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(gpu_test::dtype_label(dtype));
    auto got = generate_on_cuda(*ckpt, runner_options(Device::kCuda, dtype), requests, 1, together);
    LITELLAMA_ASSERT_OK(got.status());
    const double tol = dtype == DType::kBF16 ? 4e-2 : 8e-3;
    for (size_t i = 0; i < requests.size(); ++i) {
      const TopLogits& w = want->tops[i][0];
      const TopLogits& g = got->tops[i][0];
      double scale = 0;
      for (const auto& [id, v] : w) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      EXPECT_NEAR(g[0].second, w[0].second, tol * scale) << "request " << i;
      // The greedy pick must be the CPU's unless the CPU's top two are within tolerance.
      if (w[0].second - w[1].second > 2 * tol * scale) {
        EXPECT_EQ(got->ids[i][0], want->ids[i][0]) << "request " << i;
      }
    }
    std::printf("[ %s ] %s CUDA vs float32 CPU: max top-logit relative difference %.3g\n",
                m.preset.c_str(), gpu_test::dtype_label(dtype), max_rel_diff(*got, *want));
  }
}

// Decode steps launched as captured CUDA graphs against the same kernels launched one by one:
// requests start at different steps (prefill chunks mixed with decode steps), so batches grow and
// shrink and each batch size is captured once and replayed over growing contexts and shuffled
// slots; a second pass reuses the same runner's graphs with other requests.
TEST_P(CudaModelRunnerTest, CudaGraphsMatchDirectLaunches) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase& m = GetParam();
  TempDir dir(m.preset + "_graphs");
  auto ckpt = make_checkpoint(dir, m, DType::kF32, 9);
  LITELLAMA_ASSERT_OK(ckpt.status());
  DirectAndGraphRunners runners;
  ASSERT_NO_FATAL_FAILURE(make_direct_and_graph_runners(*ckpt, DType::kF32, &runners));
  ModelRunner* direct = runners.direct.get();
  ModelRunner* graphs = runners.graphs.get();
  std::mt19937 rng(23);
  const int32_t n_new = 30;
  for (int pass = 0; pass < 2; ++pass) {
    const auto requests = make_requests({3, 1, 45, 9, 17}, n_new, ckpt->config().vocab_size,
                                        direct->n_kv_slots(), rng);
    const std::vector<int32_t> starts =
        pass == 0 ? std::vector<int32_t>{0, 0, 2, 5, 11} : std::vector<int32_t>{0, 3, 0, 0, 7};
    auto want = generate(*direct, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(want.status());
    auto got = generate(*graphs, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(got.status());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got->ids[i], want->ids[i]) << "pass " << pass << " request " << i;
      for (size_t s = 0; s < want->tops[i].size(); ++s) {
        EXPECT_TRUE(tops_close(got->tops[i][s], want->tops[i][s], 1e-5))
            << "pass " << pass << " request " << i << " step " << s;
      }
    }
    std::printf("[ %s ] float32 graphs vs direct launches, pass %d: max relative difference %.3g\n",
                m.preset.c_str(), pass, max_rel_diff(*got, *want));
  }
}

// The small-batch decode path in bf16 and fp16 (tensor-core GEMV variants with the residual add
// and RoPE in their epilogues, in bf16 the input RMSNorm folded into the QKV GEMV; gate/up through
// cuBLAS + silu_mul, through the GEMV with SiLU * up in its epilogue, or the default mix;
// programmatic dependent launch, graphs) against the reference path (cuBLAS, separate kernels,
// plain launches, no graphs) over mixed prefill + decode steps of 1 to 5 sequences: top logits
// within the dtype's tolerance; greedy ids equal until a step where the reference's top two are a
// near tie (after that the sequences legitimately diverge). The fast path with and without graphs
// must agree exactly: the same kernels run in both. This runs it on model m.
void expect_decode_kernels_match_reference_path(const ModelCase& m, const std::string& dir_name) {
  TempDir dir(dir_name);
  auto ckpt = make_checkpoint(dir, m, DType::kBF16, 10);
  LITELLAMA_ASSERT_OK(ckpt.status());
  std::mt19937 rng(24);
  const int32_t n_new = 24;
  const std::vector<int32_t> starts{0, 0, 2, 5, 11};
  // gate/up through cuBLAS, through the GEMV, and the default (the GEMV for steps of up to 2
  // tokens).
  for (const auto& [dtype, gate_up_max_tokens] :
       {std::pair{DType::kBF16, 0}, std::pair{DType::kBF16, kGemvMaxRows},
        std::pair{DType::kF16, -1}}) {
    SCOPED_TRACE(std::string(gpu_test::dtype_label(dtype)) + ", gate/up GEMV up to " +
                 std::to_string(gate_up_max_tokens) + " tokens");
    RunnerOptions reference_options = runner_options(Device::kCuda, dtype);
    reference_options.use_cuda_graphs = false;
    reference_options.gemv_max_tokens = 0;
    reference_options.use_programmatic_launch = false;
    RunnerOptions fast_options = runner_options(Device::kCuda, dtype);
    fast_options.gemv_max_tokens = kGemvMaxRows;
    fast_options.gemv_gate_up_max_tokens = gate_up_max_tokens;
    RunnerOptions direct_options = fast_options;
    direct_options.use_cuda_graphs = false;
    const auto requests = make_requests({3, 1, 45, 9, 17}, n_new, ckpt->config().vocab_size,
                                        reference_options.n_kv_slots, rng);
    auto want = generate_on_cuda(*ckpt, reference_options, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(want.status());
    auto got = generate_on_cuda(*ckpt, fast_options, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(got.status());
    auto got_direct = generate_on_cuda(*ckpt, direct_options, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(got_direct.status());
    const double tol = dtype == DType::kBF16 ? 4e-2 : 8e-3;
    const int32_t compared = expect_fast_path_matches(*got, *got_direct, *want, tol);
    EXPECT_GE(compared, 5 * 2);
    std::printf(
        "[ %s ] %s (gate/up GEMV up to %d tokens) decode kernels vs reference path: max top-logit "
        "relative difference %.3g over %d steps\n",
        dir_name.c_str(), gpu_test::dtype_label(dtype), gate_up_max_tokens,
        max_rel_diff(*got, *want), compared);
  }
}

TEST_P(CudaModelRunnerTest, HalfPrecisionDecodeKernelsMatchReferencePath) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase& m = GetParam();
  expect_decode_kernels_match_reference_path(m, m.preset + "_fast");
}

// The same on a model whose down projection takes the GEMV's k segments (kernels/gemv.cu: k of at
// least 4096, no more 16-row tiles than multiprocessors): hidden 256 and intermediate 4096 cut
// k into 8, 4 and 2 segments at 1, 2 and 3 to 4 tokens (on a GPU of at least 128
// multiprocessors; smaller ones take fewer), and the decode batches here run 1 to 5 tokens.
TEST(CudaModelRunner, SegmentedDownProjectionMatchesReferencePath) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the tensor-core GEMV's k segments");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase m{"llama3-tiny", 4, 2, 256, 4096};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    EXPECT_GT(gemv_residual_add_k_segments(dtype, 1, m.hidden, m.intermediate), 1)
        << "the shape no longer takes k segments: the test would not cover them";
    EXPECT_GT(gemv_residual_add_k_segments(dtype, 3, m.hidden, m.intermediate), 1);
    EXPECT_EQ(gemv_residual_add_k_segments(dtype, 5, m.hidden, m.intermediate), 1);
  }
  expect_decode_kernels_match_reference_path(m, "llama3_tiny_segmented_down");
}

#if LITELLAMA_PROFILING
// RunnerOptions::layer_kernel_repeats (profiling builds, bench/step_breakdown.py): launching the
// QKV, attention, post-attention norm and gate/up kernels twice per layer repeats the same work, so
// every sampled id and top logit stays exactly as in the normal step (each kernel sums in a fixed
// order), with gate/up through the GEMV and through cuBLAS; launching o twice adds its output to
// the residual stream twice and must change the logits. Counts outside 0 to 2 are refused.
TEST_P(CudaModelRunnerTest, RepeatedLayerKernelsKeepTheOutputs) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const ModelCase& m = GetParam();
  TempDir dir(m.preset + "_repeats");
  auto ckpt = make_checkpoint(dir, m, DType::kBF16, 12);
  LITELLAMA_ASSERT_OK(ckpt.status());
  std::mt19937 rng(26);
  const int32_t n_new = 10;
  const std::vector<int32_t> starts{0, 0, 3};
  const ModelConfig& config = ckpt->config();
  const int32_t q_dim = config.n_heads * config.head_dim;
  if (!gemv_supports(DType::kBF16, DType::kBF16, 1, q_dim)) {
    // A query width the GEMV layers do not take: the repeats would act on nothing, so the
    // runner must refuse them rather than profile a path that is not run.
    RunnerOptions repeated = runner_options(Device::kCuda, DType::kBF16);
    repeated.gemv_max_tokens = kGemvMaxRows;
    repeated.layer_kernel_repeats.o = 2;
    EXPECT_EQ(create_cuda_model_runner(*ckpt, repeated).status().code(),
              StatusCode::kInvalidArgument);
    return;
  }
  for (int32_t gate_up_max_tokens : {0, kGemvMaxRows}) {
    SCOPED_TRACE("gate/up GEMV up to " + std::to_string(gate_up_max_tokens) + " tokens");
    RunnerOptions normal = runner_options(Device::kCuda, DType::kBF16);
    normal.gemv_max_tokens = kGemvMaxRows;
    normal.gemv_gate_up_max_tokens = gate_up_max_tokens;
    RunnerOptions repeated = normal;
    repeated.layer_kernel_repeats = {.qkv = 2, .attention = 2, .post_norm = 2, .gate_up = 2};
    RunnerOptions o_twice = normal;
    o_twice.layer_kernel_repeats.o = 2;
    const auto requests =
        make_requests({5, 1, 12}, n_new, ckpt->config().vocab_size, normal.n_kv_slots, rng);
    auto want = generate_on_cuda(*ckpt, normal, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(want.status());
    auto got = generate_on_cuda(*ckpt, repeated, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(got.status());
    auto changed = generate_on_cuda(*ckpt, o_twice, requests, n_new, starts);
    LITELLAMA_ASSERT_OK(changed.status());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got->ids[i], want->ids[i]) << "request " << i;
      for (size_t s = 0; s < want->tops[i].size(); ++s) {
        EXPECT_EQ(got->tops[i][s], want->tops[i][s]) << "request " << i << " step " << s;
      }
    }
    EXPECT_GT(max_rel_diff(*changed, *want), 1e-2);
  }
  RunnerOptions bad = runner_options(Device::kCuda, DType::kBF16);
  bad.layer_kernel_repeats.down = 3;
  EXPECT_EQ(create_cuda_model_runner(*ckpt, bad).status().code(), StatusCode::kInvalidArgument);
}
#endif  // LITELLAMA_PROFILING

INSTANTIATE_TEST_SUITE_P(Models, CudaModelRunnerTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           std::string name = info.param.preset;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(CudaModelRunner, RefusesUnsupportedHeadDim) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("qwen3_hd320");
  auto preset = find_random_checkpoint_preset("qwen3-tiny");
  LITELLAMA_ASSERT_OK(preset.status());
  auto config = preset->config;
  config["head_dim"] = 320;  // the attention kernels take head sizes up to 256
  LITELLAMA_ASSERT_OK(write_random_checkpoint(dir.str(), config, {}));
  auto ckpt = Checkpoint::open(dir.str());
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto runner = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kBF16));
  ASSERT_FALSE(runner.is_ok());
  EXPECT_EQ(runner.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(runner.status().message().find("head_dim 320"), std::string::npos)
      << runner.status().message();
}

TEST(CudaModelRunner, RejectsBadBatchesWithoutWriting) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("bad_batch");
  auto ckpt = make_checkpoint(dir, kModels[0], DType::kBF16, 9);
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto runner = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kBF16));
  LITELLAMA_ASSERT_OK(runner.status());
  StepBatch batch;
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> slots = {0, 1, 5000};  // outside the 1024-slot pool
  batch.add_sequence(tokens, slots, true, SamplingParams{}, 0);
  StepOutput out;
  EXPECT_EQ((*runner)->step(batch, &out).code(), StatusCode::kInvalidArgument);
  // The range check runs as the slot table is staged: negative slots and the message too.
  batch.clear();
  const std::vector<int32_t> negative_slots = {0, -1, 2};
  batch.add_sequence(tokens, negative_slots, true, SamplingParams{}, 0);
  const Status negative = (*runner)->step(batch, &out);
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("KV slot -1 is outside the pool (size 1024)"),
            std::string::npos)
      << negative.message();
  batch.clear();
  const std::vector<int32_t> ok_slots = {0, 1, 2};
  batch.add_sequence(tokens, ok_slots, true, SamplingParams{}, 0);
  batch.n_top_logits = 1000;
  EXPECT_EQ((*runner)->step(batch, &out).code(), StatusCode::kUnsupported);
  batch.n_top_logits = 3;
  LITELLAMA_ASSERT_OK((*runner)->step(batch, &out));
  ASSERT_EQ(out.sampled_ids.size(), 1u);
  EXPECT_GE(out.sampled_ids[0], 0);
  EXPECT_EQ(out.top_logits[0].size(), 3u);
}

TEST(CudaModelRunner, ReportsTheDeviceTimeOfEachStep) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("device_time");
  auto ckpt = make_checkpoint(dir, kModels[0], DType::kBF16, 11);
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto runner = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kBF16));
  LITELLAMA_ASSERT_OK(runner.status());
  EXPECT_FALSE((*runner)->last_step_device_seconds().has_value());
  std::vector<int32_t> tokens = {3, 4, 5, 6};
  std::vector<int32_t> slots = {0, 1, 2, 3};
  StepBatch batch;
  StepOutput out;
  for (int step = 0; step < 4; ++step) {  // a prefill, then eager, captured and replayed decode
    batch.clear();
    if (step == 0) {
      batch.add_sequence(tokens, slots, true, SamplingParams{}, 0);
    } else {
      batch.add_sequence(std::span(&tokens.back(), 1), slots, true, SamplingParams{}, step);
    }
    const auto t0 = std::chrono::steady_clock::now();
    LITELLAMA_ASSERT_OK((*runner)->step(batch, &out));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto device = (*runner)->last_step_device_seconds();
    ASSERT_TRUE(device.has_value()) << "step " << step;
    EXPECT_GT(*device, 0.0) << "step " << step;
    EXPECT_LE(*device, wall) << "step " << step;
    tokens.push_back(out.sampled_ids[0]);
    slots.push_back(static_cast<int32_t>(slots.size()));
  }
  // Steps 1 to 3 decode one sequence: eager at first sight, then captured, then replayed.
  EXPECT_EQ((*runner)->graph_captures(), 1);
  EXPECT_EQ((*runner)->graph_replays(), 1);
  // A refused batch leaves the last figure in place.
  const double before = *(*runner)->last_step_device_seconds();
  batch.clear();
  const std::vector<int32_t> bad_slots = {5000};
  batch.add_sequence(std::span(&tokens.back(), 1), bad_slots, true, SamplingParams{}, 9);
  EXPECT_FALSE((*runner)->step(batch, &out).is_ok());
  EXPECT_EQ(*(*runner)->last_step_device_seconds(), before);
}

// Decode graphs are keyed on whether every row is greedy: an all-greedy step runs the argmax
// kernel, any other the general sampler, which also applies penalties from the history's own
// staging buffer. Three sequences decode 12 steps: the second sampled (T 1, top-p 0.9) on odd
// steps, the third greedy with repetition/frequency/presence penalties on every third, so greedy
// and non-greedy steps have the same batch size. The graph runner must produce what direct
// launches produce (the same kernels run in both), from 2 captures and 8 replays: penalized steps
// replay graphs too.
TEST(CudaModelRunner, GraphsServeGreedySampledAndPenalizedSteps) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("graphs_sampled");
  auto ckpt = make_checkpoint(dir, kModels[0], DType::kBF16, 12);
  LITELLAMA_ASSERT_OK(ckpt.status());
  DirectAndGraphRunners runners;
  ASSERT_NO_FATAL_FAILURE(make_direct_and_graph_runners(*ckpt, DType::kBF16, &runners));
  ModelRunner& direct = *runners.direct;
  ModelRunner& graphs = *runners.graphs;
  constexpr int32_t kSeqs = 3;
  SteppedSequences seqs(kSeqs, 5, ckpt->config().vocab_size, 17, 5, 1);
  const SamplingParams sampled{.temperature = 1.0f, .top_p = 0.9f, .seed = 7};
  const SamplingParams penalized{
      .repetition_penalty = 1.3f, .frequency_penalty = 0.5f, .presence_penalty = 0.2f};
  StepBatch batch;
  StepOutput want, got;
  for (int32_t step = 0; step <= 12; ++step) {  // step 0: the prefills
    batch.clear();
    for (int32_t s = 0; s < kSeqs; ++s) {
      const bool penalize = s == 2 && step % 3 == 2;
      const SamplingParams params =
          s == 1 && step % 2 == 1 ? sampled : (penalize ? penalized : SamplingParams{});
      seqs.add(batch, s, step, params, penalize);
    }
    LITELLAMA_ASSERT_OK(direct.step(batch, &want));
    LITELLAMA_ASSERT_OK(graphs.step(batch, &got));
    EXPECT_EQ(got.sampled_ids, want.sampled_ids) << "step " << step;
    seqs.append(want.sampled_ids);  // the same next input for both runners
  }
  // Two kinds of 3-sequence decode step (8 non-greedy, 4 greedy): eager at first sight, captured,
  // then replayed.
  EXPECT_EQ(graphs.graph_captures(), 2);
  EXPECT_EQ(graphs.graph_replays(), 8);
}

// Logprobs through the CUDA runner, fp32 and bf16, greedy, sampled and penalized rows in one
// step, from direct launches and from CUDA graphs (logprobs key their own graphs): the graph
// runner returns what direct launches return; a greedy row's logprob is its top logit less the
// log-sum-exp (the runner's raw logits); in fp32 the log-sum-exp matches the CPU runner's.
TEST(CudaModelRunner, LogprobsMatchInAndOutOfGraphsAndTheCpuRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype == DType::kF32 ? "float32" : "bfloat16");
    TempDir dir(dtype == DType::kF32 ? "logprobs_f32" : "logprobs_bf16");
    auto ckpt = make_checkpoint(dir, kModels[0], dtype, 13);
    LITELLAMA_ASSERT_OK(ckpt.status());
    DirectAndGraphRunners runners;
    ASSERT_NO_FATAL_FAILURE(make_direct_and_graph_runners(*ckpt, dtype, &runners));
    ModelRunner& direct = *runners.direct;
    ModelRunner& graphs = *runners.graphs;
    std::unique_ptr<ModelRunner> cpu;
    if (dtype == DType::kF32) {
      auto made = create_model_runner(*ckpt, runner_options(Device::kCpu, DType::kF32));
      LITELLAMA_ASSERT_OK(made.status());
      cpu = std::move(made).value();
    }
    constexpr int32_t kSeqs = 3;
    SteppedSequences seqs(kSeqs, 4, ckpt->config().vocab_size, 13, 7, 3);
    const SamplingParams sampled{.temperature = 1.2f, .top_k = 20, .seed = 3};
    const SamplingParams penalized{.repetition_penalty = 1.4f, .presence_penalty = 0.3f};
    StepBatch batch;
    StepOutput want, got, ref;
    for (int32_t step = 0; step <= 6; ++step) {
      batch.clear();
      batch.logprobs = true;
      batch.n_top_logits = 4;
      for (int32_t s = 0; s < kSeqs; ++s) {
        const SamplingParams params = s == 1 ? sampled : (s == 2 ? penalized : SamplingParams{});
        seqs.add(batch, s, step, params, true);
      }
      LITELLAMA_ASSERT_OK(direct.step(batch, &want));
      LITELLAMA_ASSERT_OK(graphs.step(batch, &got));
      ASSERT_EQ(want.logprobs.size(), static_cast<size_t>(kSeqs));
      ASSERT_EQ(got.logprobs.size(), static_cast<size_t>(kSeqs));
      EXPECT_EQ(got.sampled_ids, want.sampled_ids) << "step " << step;
      for (int32_t s = 0; s < kSeqs; ++s) {
        EXPECT_FLOAT_EQ(got.logprobs[s], want.logprobs[s]) << "step " << step << " seq " << s;
        EXPECT_FLOAT_EQ(got.lse[s], want.lse[s]) << "step " << step << " seq " << s;
        EXPECT_LE(want.logprobs[s], 0.0f);
        ASSERT_EQ(want.top_logits[s].size(), 4u);
        if (s == 0) {  // greedy without penalties: the raw argmax
          EXPECT_EQ(want.sampled_ids[s], want.top_logits[s][0].first);
          EXPECT_NEAR(want.logprobs[s], want.top_logits[s][0].second - want.lse[s], 1e-5);
        }
      }
      if (cpu) {
        LITELLAMA_ASSERT_OK(cpu->step(batch, &ref));
        for (int32_t s = 0; s < kSeqs; ++s) {
          EXPECT_NEAR(want.lse[s], ref.lse[s], 2e-3) << "step " << step << " seq " << s;
        }
        EXPECT_NEAR(want.logprobs[0], ref.logprobs[0], 2e-3) << "step " << step;
      }
      seqs.append(want.sampled_ids);
    }
    EXPECT_GT(graphs.graph_replays(), 0);
  }
}

TEST(CudaModelRunner, SizesThePoolFromFreeMemory) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("pool_fraction");
  auto ckpt = make_checkpoint(dir, kModels[4], DType::kBF16, 10);
  LITELLAMA_ASSERT_OK(ckpt.status());
  RunnerOptions o = runner_options(Device::kCuda, DType::kBF16);
  o.n_kv_slots = 0;
  o.kv_memory_fraction = 0.01;
  size_t free_bytes = 0, total_bytes = 0;
  LITELLAMA_ASSERT_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  auto runner = create_cuda_model_runner(*ckpt, o);
  LITELLAMA_ASSERT_OK(runner.status());
  const ModelConfig& c = ckpt->config();
  const double slot_bytes = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim * 2;
  const int32_t n_slots = (*runner)->n_kv_slots();
  EXPECT_GT(n_slots, 0);
  EXPECT_LE(n_slots * slot_bytes, 0.01 * static_cast<double>(free_bytes));
  EXPECT_GT(n_slots * slot_bytes, 0.005 * static_cast<double>(free_bytes));
  // The last slot of the pool is usable.
  StepBatch batch;
  const std::vector<int32_t> tokens = {5, 6};
  const std::vector<int32_t> slots = {n_slots - 1, 0};
  batch.add_sequence(tokens, slots, true, SamplingParams{}, 0);
  StepOutput out;
  LITELLAMA_ASSERT_OK((*runner)->step(batch, &out));
  EXPECT_GE(out.sampled_ids[0], 0);
}

// --gpu-memory-utilization as vLLM means it: the share of the device's total memory this process
// may hold; the pool gets what is left of it, and a share below what is in use is refused.
// --gpu-memory-utilization is a per-instance limit: memory another allocation holds (here 20% of
// the device, as a second server would) does not count against it.
TEST(CudaModelRunner, SizesThePoolFromGpuMemoryUtilization) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("pool_utilization");
  auto ckpt = make_checkpoint(dir, kModels[4], DType::kBF16, 10);
  LITELLAMA_ASSERT_OK(ckpt.status());
  size_t free_bytes = 0, total_bytes = 0;
  LITELLAMA_ASSERT_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  void* other = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaMalloc(&other, total_bytes / 5));
  RunnerOptions o = runner_options(Device::kCuda, DType::kBF16);
  o.n_kv_slots = 0;
  o.gpu_memory_utilization = 0.02;
  auto runner = create_cuda_model_runner(*ckpt, o);
  LITELLAMA_ASSERT_OK(runner.status());
  const ModelConfig& c = ckpt->config();
  const double slot_bytes = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim * 2;
  const int32_t n_slots = (*runner)->n_kv_slots();
  // The 2% less this worker's weights and workspaces (well under 1 GiB here): most of it.
  EXPECT_LE(n_slots * slot_bytes, 0.02 * static_cast<double>(total_bytes));
  EXPECT_GE(n_slots * slot_bytes, 0.02 * static_cast<double>(total_bytes) - (1u << 30));
  runner->reset();
  o.gpu_memory_utilization = 1e-5;  // less than the weights and workspaces alone
  auto refused = create_cuda_model_runner(*ckpt, o);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--gpu-memory-utilization"), std::string::npos)
      << refused.status().to_string();
  LITELLAMA_ASSERT_CUDA(cudaFree(other));
}

// Time of one batch-1 decode step (host wall clock around step(), which ends in the step's only
// synchronization) on a Llama-3.2-1B shape in bf16. Run with --gtest_also_run_disabled_tests.
TEST(CudaModelRunnerTiming, DISABLED_DecodeStepLlama32_1B) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("llama32_1b");
  auto preset = find_random_checkpoint_preset("llama3.2-1b");
  LITELLAMA_ASSERT_OK(preset.status());
  RandomCheckpointOptions wo;
  wo.storage_dtype = DType::kBF16;
  LITELLAMA_ASSERT_OK(write_random_checkpoint(dir.str(), preset->config, wo));
  auto ckpt = Checkpoint::open(dir.str());
  LITELLAMA_ASSERT_OK(ckpt.status());
  RunnerOptions o = runner_options(Device::kCuda, DType::kBF16);
  o.n_kv_slots = 32768;
  o.max_batch_tokens = 2048;
  o.max_batch_seqs = 64;
  auto runner = create_cuda_model_runner(*ckpt, o);
  LITELLAMA_ASSERT_OK(runner.status());
  std::mt19937 rng(5);
  for (int32_t batch_size : {1, 8, 32}) {
    const int32_t prompt = 512, n_steps = 40;
    const auto requests =
        make_requests(std::vector<int32_t>(static_cast<size_t>(batch_size), prompt), n_steps + 1,
                      ckpt->config().vocab_size, o.n_kv_slots, rng);
    std::vector<std::vector<int32_t>> tokens;
    StepBatch batch;
    StepOutput out;
    double prefill_ms = 0;
    for (const Request& r : requests) {  // one prefill step per request (max_batch_tokens)
      batch.clear();
      batch.add_sequence(r.prompt, std::span(r.slots.data(), r.prompt.size()), true,
                         SamplingParams{}, 0);
      const auto t0 = std::chrono::steady_clock::now();
      LITELLAMA_ASSERT_OK((*runner)->step(batch, &out));
      prefill_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      tokens.push_back(r.prompt);
      tokens.back().push_back(out.sampled_ids[0]);
    }
    std::vector<double> times;
    for (int32_t step = 0; step < n_steps; ++step) {
      batch.clear();
      for (size_t i = 0; i < requests.size(); ++i) {
        if (step > 0) tokens[i].push_back(out.sampled_ids[i]);
        const size_t kv = tokens[i].size();
        batch.add_sequence(std::span(&tokens[i].back(), 1), std::span(requests[i].slots.data(), kv),
                           true, SamplingParams{}, step + 1);
      }
      const auto t0 = std::chrono::steady_clock::now();
      LITELLAMA_ASSERT_OK((*runner)->step(batch, &out));
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin() + 5, times.end());
    std::printf(
        "[ llama3.2-1b bf16 ] batch %d: prefill of %d tokens %.2f ms; "
        "decode step median %.3f ms, min %.3f ms (kv_len ~%d)\n",
        batch_size, prompt, prefill_ms, times[5 + (times.size() - 5) / 2], times[5],
        prompt + n_steps / 2);
  }
}

// Input embedding rows (LLaVA's image features) replace the lookup of some prompt tokens: the
// CUDA runner reads them in place from device memory and must give, in float32, the CPU runner's
// greedy id and top logits for the same rows read from host memory; rows in host memory are
// refused with a clear error, and the rows must change the output.
TEST(CudaModelRunner, InputEmbeddingRowsInDeviceMemoryMatchTheCpuRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  TempDir dir("embed_rows");
  auto ckpt = make_checkpoint(dir, kModels[0], DType::kF32, 13);
  LITELLAMA_ASSERT_OK(ckpt.status());
  auto cpu = create_cpu_model_runner(*ckpt, runner_options(Device::kCpu, DType::kF32));
  LITELLAMA_ASSERT_OK(cpu.status());
  auto cuda = create_cuda_model_runner(*ckpt, runner_options(Device::kCuda, DType::kF32));
  LITELLAMA_ASSERT_OK(cuda.status());
  const int32_t hidden = ckpt->config().hidden_size;
  std::vector<int32_t> tokens(12);
  std::vector<int32_t> slots(12);
  std::iota(tokens.begin(), tokens.end(), 20);
  std::iota(slots.begin(), slots.end(), 0);
  const std::vector<int32_t> rows_at = {3, 4, 5, 6, 7};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> rows(rows_at.size() * static_cast<size_t>(hidden));
  for (float& x : rows) x = u(rng);
  float* device_rows = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaMalloc(&device_rows, rows.size() * sizeof(float)));
  LITELLAMA_ASSERT_CUDA(
      cudaMemcpy(device_rows, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
  auto make = [&](const float* embed, EmbeddingMemory memory) {
    StepBatch b;
    b.add_sequence(tokens, slots, true, SamplingParams{}, 0);
    b.n_top_logits = kTop;
    if (embed != nullptr) {
      b.embed_token_index = rows_at;
      b.embed_rows = embed;
      b.embed_rows_memory = memory;
    }
    return b;
  };
  StepOutput want, got, plain;
  LITELLAMA_ASSERT_OK((*cpu)->step(make(rows.data(), EmbeddingMemory::kHost), &want));
  LITELLAMA_ASSERT_OK((*cuda)->step(make(device_rows, EmbeddingMemory::kDevice), &got));
  EXPECT_EQ(got.sampled_ids, want.sampled_ids);
  EXPECT_TRUE(tops_close(got.top_logits[0], want.top_logits[0], 1e-4));
  LITELLAMA_ASSERT_OK((*cuda)->step(make(nullptr, EmbeddingMemory::kHost), &plain));
  EXPECT_GT(std::fabs(plain.top_logits[0][0].second - got.top_logits[0][0].second), 1e-6)
      << "the rows did not change the logits";
  const Status host = (*cuda)->step(make(rows.data(), EmbeddingMemory::kHost), &got);
  EXPECT_EQ(host.code(), StatusCode::kUnsupported);
  EXPECT_NE(host.message().find("device memory"), std::string::npos) << host.message();
  (void)cudaFree(device_rows);
}

}  // namespace
}  // namespace litellama
