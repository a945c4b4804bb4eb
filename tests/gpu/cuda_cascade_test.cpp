// Shared-prefix (cascade) decode attention through the CUDA runner: groups of sequences whose
// tables share a 300-key prefix (as the scheduler's prefix cache lays them out) decode with the
// cascade on and off; the KV pool holds the same values in both runs, so the runs differ only in
// how attention splits its sums over the keys, and greedy ids and top logits must agree within
// the 16-bit tolerance. Graph replays are part of both runs (the decode steps repeat one shape).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "services/worker/checkpoint.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/model_runner.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;
using gpu_test::dtype_label;
using gpu_test::tolerance;
using TopLogits = std::vector<std::pair<int32_t, float>>;

// Members per group (29 decode sequences, past kCascadeMinDecode). At 4 heads per KV head a task
// holds up to 16 sequences, so the prefix tasks have 64 rows (all four warps full) and 12 (group
// 0), 20 (a wide task with a partly filled warp), 12 and 8 (the split-over-keys form); at 8 heads
// per KV head up to 8 sequences: 64, 64, 24, 40, 24 and 16 rows.
constexpr int32_t kGroupSizes[] = {19, 5, 3, 2};
constexpr auto kGroups = static_cast<int32_t>(std::size(kGroupSizes));
constexpr int32_t kSeqs = std::accumulate(std::begin(kGroupSizes), std::end(kGroupSizes), 0);
constexpr int32_t kPrefix = 300;
constexpr int32_t kSuffix = 12;
constexpr int32_t kDecodeSteps = 8;
constexpr int32_t kTop = 8;

struct Shape {
  int32_t n_heads, n_kv_heads, hidden, head_dim;
};

struct Seq {
  std::vector<int32_t> ids;    // prompt, then what was generated
  std::vector<int32_t> slots;  // of every position
  int32_t n_prompt = 0;
  bool first = false;  // the group's first member: its prefill writes the shared prefix
};

struct Run {
  std::vector<std::vector<int32_t>> ids;     // [seq][decode step]
  std::vector<std::vector<TopLogits>> tops;  // [seq][decode step]
  int64_t cascade_steps = 0;
};

// Group g's members share the prompt's first kPrefix ids and their slots; each member has its own
// kSuffix ids and slots for the rest.
std::vector<Seq> make_seqs(int32_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> perm(kGroups * kPrefix + kSeqs * (kSuffix + kDecodeSteps + 4));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  std::vector<Seq> seqs;
  for (int32_t g = 0; g < kGroups; ++g) {
    std::vector<int32_t> prefix_ids, prefix_slots;
    for (int32_t i = 0; i < kPrefix; ++i) {
      prefix_ids.push_back(id(rng));
      prefix_slots.push_back(perm[next++]);
    }
    for (int32_t m = 0; m < kGroupSizes[g]; ++m) {
      Seq s{prefix_ids, prefix_slots, kPrefix + kSuffix, m == 0};
      for (int32_t i = 0; i < kSuffix; ++i) s.ids.push_back(id(rng));
      for (int32_t i = 0; i < kSuffix + kDecodeSteps + 4; ++i) s.slots.push_back(perm[next++]);
      seqs.push_back(std::move(s));
    }
  }
  return seqs;
}

// Step 0 prefills each group's first member, step 1 the others' own ids (their prefix is in the
// pool) beside the first members' first decode, then every sequence decodes kDecodeSteps times.
Result<Run> run(const Checkpoint& ckpt, DType dtype, bool cascade, std::vector<Seq> seqs) {
  RunnerOptions o;
  o.device = Device::kCuda;
  o.compute_dtype = dtype;
  o.n_kv_slots = 4096;
  o.max_batch_tokens = 2048;
  o.max_batch_seqs = 32;
  o.decode_cascade = cascade;
  LITELLAMA_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                             create_cuda_model_runner(ckpt, o));
  Run r;
  r.ids.resize(seqs.size());
  r.tops.resize(seqs.size());
  std::vector<int32_t> n_cached(seqs.size(), 0);
  for (int32_t step = 0; step < 2 + kDecodeSteps; ++step) {
    StepBatch batch;
    batch.n_top_logits = kTop;
    std::vector<size_t> in_batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const bool first = seqs[i].first;
      if (step == 0 && !first) continue;
      if (step == 1 && !first) n_cached[i] = kPrefix;
      Seq& s = seqs[i];
      const auto kv = static_cast<int32_t>(s.ids.size());
      batch.add_sequence(std::span(s.ids).subspan(static_cast<size_t>(n_cached[i])),
                         std::span(s.slots).first(static_cast<size_t>(kv)), true, SamplingParams{},
                         kv - s.n_prompt);
      n_cached[i] = kv;
      in_batch.push_back(i);
    }
    StepOutput out;
    LITELLAMA_RETURN_IF_ERROR(runner->step(batch, &out));
    for (size_t b = 0; b < in_batch.size(); ++b) {
      const size_t i = in_batch[b];
      seqs[i].ids.push_back(out.sampled_ids[b]);
      if (step >= 2) {
        r.ids[i].push_back(out.sampled_ids[b]);
        r.tops[i].push_back(out.top_logits[b]);
      }
    }
  }
  r.cascade_steps = runner->cascade_steps();
  return r;
}

// Top logits within tol of the reference's (relative to its largest) while the greedy ids agree;
// where they part, the reference must have a near tie (the contexts differ from there on).
void expect_close(const Run& got, const Run& want, double tol) {
  for (size_t i = 0; i < want.ids.size(); ++i) {
    for (size_t s = 0; s < want.ids[i].size(); ++s) {
      const TopLogits& g = got.tops[i][s];
      const TopLogits& w = want.tops[i][s];
      ASSERT_EQ(g.size(), w.size());
      double scale = 1e-3;
      for (const auto& [id, v] : w) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      for (size_t k = 0; k < w.size(); ++k) {
        EXPECT_NEAR(g[k].second, w[k].second, tol * scale)
            << "sequence " << i << " step " << s << " rank " << k;
      }
      if (got.ids[i][s] != want.ids[i][s]) {
        EXPECT_LE(w[0].second - w[1].second, 2 * tol * scale)
            << "sequence " << i << " step " << s << ": greedy ids differ without a near tie";
        break;
      }
    }
  }
}

void check_shape(const Shape& shape, uint64_t seed) {
  const fs::path dir =
      fs::temp_directory_path() /
      ("litellama_cascade_" + std::to_string(shape.head_dim) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto preset = find_random_checkpoint_preset("llama3-tiny");
  ASSERT_TRUE(preset.is_ok()) << preset.status().message();
  nlohmann::json config = preset->config;
  config["hidden_size"] = shape.hidden;
  config["num_attention_heads"] = shape.n_heads;
  config["num_key_value_heads"] = shape.n_kv_heads;
  config["head_dim"] = shape.head_dim;
  config["intermediate_size"] = 2 * shape.hidden;
  config["num_hidden_layers"] = 2;
  RandomCheckpointOptions options;
  options.seed = seed;
  options.storage_dtype = DType::kBF16;
  ASSERT_TRUE(write_random_checkpoint(dir.string(), config, options).is_ok());
  auto ckpt = Checkpoint::open(dir.string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<Seq> seqs = make_seqs(static_cast<int32_t>(config["vocab_size"]), rng);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_label(dtype)) + " head_dim " + std::to_string(shape.head_dim));
    auto on = run(*ckpt, dtype, true, seqs);
    auto off = run(*ckpt, dtype, false, seqs);
    ASSERT_TRUE(on.is_ok()) << on.status().message();
    ASSERT_TRUE(off.is_ok()) << off.status().message();
    EXPECT_EQ(on->cascade_steps, kDecodeSteps);  // every all-decode step
    EXPECT_EQ(off->cascade_steps, 0);
    expect_close(*on, *off, tolerance(dtype));
  }
  fs::remove_all(dir);
}

TEST(CudaDecodeCascade, SharedPrefixDecodeMatchesThePlainKernel) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  check_shape({8, 2, 512, 64}, 11);    // 4 heads per KV head: 16 sequences per task
  check_shape({8, 1, 1024, 128}, 12);  // 8 heads per KV head: 8 sequences per task
}

}  // namespace
}  // namespace litellama
