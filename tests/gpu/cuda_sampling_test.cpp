// The device sampler against the CPU sampler (services/worker/cpu_sampler.h), its reference: top-N
// raw logits, penalties (the penalized logits bit for bit), greedy argmax with ties, and seeded
// draws under every combination of temperature, top-k, top-p and min-p, many rows per launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "kernels/sampling.h"
#include "services/worker/cpu_sampler.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

using gpu_test::DevBuf;
using gpu_test::download;
using gpu_test::upload;

struct RowCase {
  SamplingParams params;
  std::vector<int32_t> prompt, generated;
  int64_t n_generated = 0;
};

struct DeviceResult {
  std::vector<int32_t> sampled, top_ids;
  std::vector<float> top_values, logits_after;
  std::vector<int32_t> marks_after;
  // The sampler leaves its marks workspace zero for the next launch.
  bool marks_left_zero() const {
    return std::all_of(marks_after.begin(), marks_after.end(), [](int32_t m) { return m == 0; });
  }
};

// Row r of a [rows, vocab] block of logits.
std::vector<float> logits_row(const std::vector<float>& logits, size_t r, int32_t vocab) {
  return std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
}

// The sampler's row descriptors for `cases` and the penalty history they index (each row's
// prompt, then its generated ids).
void pack_rows(const std::vector<RowCase>& cases, std::vector<SamplingRow>* rows,
               std::vector<int32_t>* history) {
  for (const RowCase& c : cases) {
    SamplingRow r;
    r.params = c.params;
    r.n_generated = static_cast<int32_t>(c.n_generated);
    r.history_begin = static_cast<int32_t>(history->size());
    history->insert(history->end(), c.prompt.begin(), c.prompt.end());
    history->insert(history->end(), c.generated.begin(), c.generated.end());
    r.history_end = static_cast<int32_t>(history->size());
    r.n_prompt = static_cast<int32_t>(c.prompt.size());
    rows->push_back(r);
  }
}

// Runs the device sampler over rows of `logits` ([n_rows, vocab]), with at most max_ctas CTAs per
// row (0: the launcher's choice).
DeviceResult run_device(const std::vector<float>& logits, const std::vector<RowCase>& cases,
                        int32_t vocab, int32_t n_top, int32_t max_ctas = 0,
                        bool greedy_only = false) {
  const auto n_rows = static_cast<int32_t>(cases.size());
  std::vector<SamplingRow> rows;
  std::vector<int32_t> history;
  pack_rows(cases, &rows, &history);
  DevBuf d_logits = upload(logits), d_rows = upload(rows), d_hist = upload(history);
  DevBuf d_sampled(static_cast<size_t>(n_rows) * 4);
  DevBuf d_top_ids(static_cast<size_t>(n_rows) * std::max(n_top, 1) * 4);
  DevBuf d_top_values(static_cast<size_t>(n_rows) * std::max(n_top, 1) * 4);
  const size_t marks_bytes = sampling_workspace_size_bytes(n_rows, vocab);
  DevBuf d_marks(marks_bytes);
  (void)cudaMemset(d_marks.get(), 0, marks_bytes);
  const Status st =
      launch_sampling(d_sampled.as<int32_t>(), d_top_ids.as<int32_t>(), d_top_values.as<float>(),
                      d_logits.as<float>(), d_rows.as<SamplingRow>(), d_hist.as<int32_t>(), n_rows,
                      vocab, n_top, d_marks.as<int32_t>(), nullptr, greedy_only, max_ctas);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DeviceResult out;
  out.sampled = download<int32_t>(d_sampled, static_cast<size_t>(n_rows));
  out.top_ids = download<int32_t>(d_top_ids, static_cast<size_t>(n_rows) * n_top);
  out.top_values = download<float>(d_top_values, static_cast<size_t>(n_rows) * n_top);
  out.logits_after = download<float>(d_logits, logits.size());
  out.marks_after = download<int32_t>(d_marks, marks_bytes / 4);
  return out;
}

// One CTA per row, two, a cluster of 8, and the launcher's choice.
constexpr int32_t kCtaLimits[] = {1, 2, 8, 0};

// Runs the cases on the device at each CTA limit of kCtaLimits (n_top top logits per row) and
// calls check(result) for each run.
template <typename Check>
void at_every_cta_limit(const std::vector<float>& logits, const std::vector<RowCase>& cases,
                        int32_t vocab, int32_t n_top, Check&& check) {
  for (int32_t max_ctas : kCtaLimits) {
    SCOPED_TRACE(testing::Message() << "CTAs per row at most " << max_ctas);
    check(run_device(logits, cases, vocab, n_top, max_ctas));
  }
}

std::vector<float> normal_logits(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(CudaSampling, GreedyAndTopLogitsMatchCpu) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(11);
  for (int32_t vocab : {1000, 32000, 128256, 151936}) {
    for (int32_t n_top : {0, 1, 8, 64}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " n_top " << n_top);
      const int32_t n_rows = 7;
      std::vector<float> logits = normal_logits(static_cast<size_t>(n_rows) * vocab, 2.0f, rng);
      // Row 1: tied maxima (the lower id wins); row 2: a tie inside the top-N.
      logits[1 * vocab + 17] = 50.0f;
      logits[1 * vocab + 5] = 50.0f;
      logits[2 * vocab + vocab - 1] = 40.0f;
      logits[2 * vocab + 3] = 40.0f;
      logits[2 * vocab + 9] = 39.0f;
      std::vector<RowCase> cases(static_cast<size_t>(n_rows));
      for (int32_t max_ctas : kCtaLimits) {
        for (bool greedy_only : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "CTAs per row at most " << max_ctas << ", greedy only " << greedy_only);
          const DeviceResult got = run_device(logits, cases, vocab, n_top, max_ctas, greedy_only);
          for (int32_t r = 0; r < n_rows; ++r) {
            std::vector<float> row = logits_row(logits, r, vocab);
            if (n_top > 0) {
              const auto want = top_logits(row, n_top);
              for (int32_t i = 0; i < n_top; ++i) {
                EXPECT_EQ(got.top_ids[r * n_top + i], want[i].first)
                    << "row " << r << " rank " << i;
                EXPECT_EQ(got.top_values[r * n_top + i], want[i].second);
              }
            }
            EXPECT_EQ(got.sampled[r], sample_token(row, SamplingParams{}, {})) << "row " << r;
          }
          EXPECT_EQ(got.sampled[1], 5);
          EXPECT_TRUE(got.marks_left_zero()) << "the workspace must be left zero";
        }
      }
    }
  }
}

TEST(CudaSampling, PenaltiesMatchCpuBitForBit) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(12);
  const int32_t vocab = 32000;
  std::vector<RowCase> cases;
  std::uniform_int_distribution<int32_t> small_id(0, 40), any_id(0, vocab - 1);
  for (int i = 0; i < 12; ++i) {
    RowCase c;
    c.params.repetition_penalty = i % 3 == 0 ? 1.0f : 1.0f + 0.15f * static_cast<float>(i);
    c.params.frequency_penalty = i % 2 == 0 ? 0.4f : 0.0f;
    c.params.presence_penalty = i % 4 == 1 ? 0.7f : (i % 3 == 0 ? 0.3f : 0.0f);
    if (!c.params.has_penalties()) c.params.presence_penalty = 0.2f;
    c.params.temperature = i % 5 == 4 ? 0.8f : 0.0f;
    c.params.seed = 1000 + static_cast<uint64_t>(i);
    c.n_generated = i;
    // Many repeats among few ids, plus ids spread over the vocabulary.
    for (int j = 0; j < 50 + 37 * i; ++j) c.prompt.push_back(j % 2 ? small_id(rng) : any_id(rng));
    for (int j = 0; j < 3 * i; ++j) c.generated.push_back(j % 2 ? small_id(rng) : any_id(rng));
    cases.push_back(c);
  }
  // Positive and negative logits near the penalized ids.
  const std::vector<float> logits = normal_logits(cases.size() * vocab, 3.0f, rng);
  at_every_cta_limit(logits, cases, vocab, 0, [&](const DeviceResult& got) {
    for (size_t r = 0; r < cases.size(); ++r) {
      std::vector<float> row = logits_row(logits, r, vocab);
      SamplingInput in{cases[r].prompt, cases[r].generated, cases[r].n_generated};
      const int32_t want = sample_token(row, cases[r].params, in);
      const std::vector<float> got_row = logits_row(got.logits_after, r, vocab);
      EXPECT_EQ(got_row, row) << "penalized logits of row " << r;
      EXPECT_EQ(got.sampled[r], want) << "row " << r;
    }
    EXPECT_TRUE(got.marks_left_zero()) << "the marks workspace must be left zero";
  });
}

TEST(CudaSampling, SeededDrawsMatchCpu) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(13);
  int n_checked = 0, n_distinct_from_greedy = 0;
  for (int32_t vocab : {1000, 128256}) {
    std::vector<RowCase> cases;
    for (float temperature : {0.5f, 1.0f, 1.7f}) {
      for (int32_t top_k : {0, 1, 5, 50}) {
        for (float top_p : {1.0f, 0.9f, 0.4f}) {
          for (float min_p : {0.0f, 0.05f, 0.3f}) {
            RowCase c;
            c.params.temperature = temperature;
            c.params.top_k = top_k;
            c.params.top_p = top_p;
            c.params.min_p = min_p;
            c.params.seed = rng();
            c.n_generated = static_cast<int64_t>(cases.size()) * 3;
            cases.push_back(c);
          }
        }
      }
    }
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const std::vector<float> logits = normal_logits(cases.size() * vocab, 2.5f, rng);
    at_every_cta_limit(logits, cases, vocab, 0, [&](const DeviceResult& got) {
      for (size_t r = 0; r < cases.size(); ++r) {
        std::vector<float> row = logits_row(logits, r, vocab);
        const int32_t greedy = sample_token(row, SamplingParams{}, {});
        SamplingInput in;
        in.n_generated = cases[r].n_generated;
        const int32_t want = sample_token(row, cases[r].params, in);
        const SamplingParams& p = cases[r].params;
        EXPECT_EQ(got.sampled[r], want) << "row " << r << " T " << p.temperature << " top_k "
                                        << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
        ++n_checked;
        n_distinct_from_greedy += want != greedy ? 1 : 0;
      }
    });
  }
  // The cases must exercise real draws, not only the argmax.
  EXPECT_GT(n_distinct_from_greedy, n_checked / 4);
}

// Logits on a coarse grid: the drawn token often sits in a group of equal logits, which the CPU
// walks by ascending id. (top-p stays off: a tie group straddling its boundary is kept whole on the
// device, see kernels/sampling.h.)
TEST(CudaSampling, DrawsAmongTiedLogitsMatchCpu) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(14);
  const int32_t vocab = 5003;  // odd: the scalar path of the row loops
  std::vector<RowCase> cases;
  for (int i = 0; i < 48; ++i) {
    RowCase c;
    c.params.temperature = 0.5f + 0.05f * static_cast<float>(i);
    c.params.top_k = i % 3 == 0 ? 0 : 7 * i;
    c.params.min_p = i % 4 == 0 ? 0.1f : 0.0f;
    c.params.seed = rng();
    c.n_generated = i;
    cases.push_back(c);
  }
  std::vector<float> logits = normal_logits(cases.size() * vocab, 1.5f, rng);
  for (float& l : logits) l = std::round(l * 2.0f) / 2.0f;
  at_every_cta_limit(logits, cases, vocab, 4, [&](const DeviceResult& got) {
    for (size_t r = 0; r < cases.size(); ++r) {
      std::vector<float> row = logits_row(logits, r, vocab);
      const auto want_top = top_logits(row, 4);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got.top_ids[r * 4 + i], want_top[i].first);
      SamplingInput in;
      in.n_generated = cases[r].n_generated;
      EXPECT_EQ(got.sampled[r], sample_token(row, cases[r].params, in)) << "row " << r;
    }
  });
}

// Time of one launch (CUDA events, median of 50 after warm-up) for 1 to 256 rows of a 128256
// vocabulary, with one CTA per row and with the launcher's choice. Run with
// --gtest_also_run_disabled_tests.
TEST(CudaSamplingTiming, DISABLED_LaunchTime) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(15);
  const int32_t vocab = 128256;
  struct Config {
    const char* name;
    SamplingParams params;
    int32_t n_top;
  };
  SamplingParams greedy;
  SamplingParams top_k_p;
  top_k_p.temperature = 0.8f;
  top_k_p.top_k = 50;
  top_k_p.top_p = 0.9f;
  SamplingParams top_p_only;
  top_p_only.temperature = 1.0f;
  top_p_only.top_p = 0.9f;
  SamplingParams top_k_only = top_k_p;
  top_k_only.top_p = 1.0f;
  SamplingParams temperature_only;
  temperature_only.temperature = 1.0f;
  SamplingParams penalties = top_k_p;
  penalties.repetition_penalty = 1.1f;
  penalties.frequency_penalty = 0.2f;
  const Config configs[] = {
      {"greedy (argmax kernel)", greedy, 0}, {"greedy", greedy, 0},
      {"greedy + 8 top logits", greedy, 8},  {"T 0.8, top-k 50, top-p 0.9", top_k_p, 0},
      {"T 0.8, top-k 50", top_k_only, 0},    {"T 1", temperature_only, 0},
      {"T 1, top-p 0.9", top_p_only, 0},     {"penalties (1000 ids), top-k/p", penalties, 0}};
  for (int32_t n_rows : {1, 8, 32, 256}) {
    for (const Config& cfg : configs) {
      std::vector<SamplingRow> rows(static_cast<size_t>(n_rows));
      std::vector<int32_t> history;
      std::uniform_int_distribution<int32_t> id(0, vocab - 1);
      for (int32_t r = 0; r < n_rows; ++r) {
        SamplingRow& row = rows[static_cast<size_t>(r)];
        row.params = cfg.params;
        row.params.presence_penalty = 0.0f;
        row.params.min_p = 0.0f;
        row.params.seed = static_cast<uint64_t>(r);
        row.history_begin = static_cast<int32_t>(history.size());
        if (cfg.params.has_penalties()) {
          for (int j = 0; j < 1000; ++j) history.push_back(id(rng));
        }
        row.history_end = static_cast<int32_t>(history.size());
        row.n_prompt = (row.history_end - row.history_begin) / 2;
      }
      const auto logits = normal_logits(static_cast<size_t>(n_rows) * vocab, 2.5f, rng);
      DevBuf d_logits = upload(logits), d_rows = upload(rows), d_hist = upload(history);
      DevBuf d_out(static_cast<size_t>(n_rows) * 4), d_ids(static_cast<size_t>(n_rows) * 64 * 4),
          d_vals(static_cast<size_t>(n_rows) * 64 * 4);
      DevBuf d_marks(sampling_workspace_size_bytes(n_rows, vocab));
      (void)cudaMemset(d_marks.get(), 0, d_marks.bytes());
      cudaEvent_t start, stop;
      (void)cudaEventCreate(&start);
      (void)cudaEventCreate(&stop);
      for (int32_t max_ctas : {1, 0}) {
        std::vector<float> times;
        for (int it = 0; it < 60; ++it) {
          (void)cudaEventRecord(start);
          LITELLAMA_ASSERT_OK(launch_sampling(
              d_out.as<int32_t>(), d_ids.as<int32_t>(), d_vals.as<float>(), d_logits.as<float>(),
              d_rows.as<SamplingRow>(), d_hist.as<int32_t>(), n_rows, vocab, cfg.n_top,
              d_marks.as<int32_t>(), nullptr, &cfg == &configs[0], max_ctas));
          (void)cudaEventRecord(stop);
          LITELLAMA_ASSERT_CUDA(cudaEventSynchronize(stop));
          float ms = 0;
          (void)cudaEventElapsedTime(&ms, start, stop);
          if (it >= 10) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        std::printf("[ sampling ] vocab %d, %3d rows, %-30s, CTAs per row %-4s: %8.1f us\n", vocab,
                    n_rows, cfg.name, max_ctas == 1 ? "1" : "auto",
                    1000.0 * times[times.size() / 2]);
      }
      (void)cudaEventDestroy(start);
      (void)cudaEventDestroy(stop);
    }
  }
}

// Every path of the sampler on small rows, sized for compute-sanitizer's racecheck (which slows
// the kernels by orders of magnitude): greedy rows with ties, top logits, penalties, and seeded
// draws under top-k, top-p and min-p, for each CTA limit, with and without the greedy-only launch.
TEST(CudaSampling, EveryPathOnSmallRowsMatchesCpu) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(15);
  for (int32_t vocab : {1000, 5003}) {
    std::vector<RowCase> cases(6);
    cases[1].params.repetition_penalty = 1.3f;
    cases[1].params.presence_penalty = 0.4f;
    cases[1].prompt = {3, 3, 17, 999};
    cases[1].generated = {5, 3};
    cases[2].params.temperature = 0.9f;
    cases[2].params.top_k = 20;
    cases[3].params.temperature = 1.2f;
    cases[3].params.top_p = 0.8f;
    cases[4].params.temperature = 0.7f;
    cases[4].params.min_p = 0.1f;
    cases[4].params.frequency_penalty = 0.5f;
    cases[4].generated = {7, 7, 8};
    cases[5].params.temperature = 1.0f;
    for (size_t r = 0; r < cases.size(); ++r) {
      cases[r].params.seed = 500 + r;
      cases[r].n_generated = static_cast<int64_t>(cases[r].generated.size());
    }
    std::vector<float> logits = normal_logits(cases.size() * vocab, 2.0f, rng);
    logits[17] = 30.0f;  // row 0: a tie at the maximum (the lower id wins)
    logits[9] = 30.0f;
    for (int32_t max_ctas : kCtaLimits) {
      for (bool greedy_only : {false, true}) {
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << ", CTAs per row at most "
                                        << max_ctas << ", greedy only " << greedy_only);
        std::vector<RowCase> launch = cases;
        if (greedy_only) {
          for (RowCase& c : launch) c.params = SamplingParams{};
        }
        const DeviceResult got = run_device(logits, launch, vocab, 8, max_ctas, greedy_only);
        for (size_t r = 0; r < launch.size(); ++r) {
          std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
          const auto want_top = top_logits(row, 8);
          for (int i = 0; i < 8; ++i) {
            EXPECT_EQ(got.top_ids[r * 8 + i], want_top[i].first) << "row " << r << " rank " << i;
          }
          SamplingInput in{launch[r].prompt, launch[r].generated, launch[r].n_generated};
          EXPECT_EQ(got.sampled[r], sample_token(row, launch[r].params, in)) << "row " << r;
        }
        EXPECT_EQ(got.sampled[0], 9);
        EXPECT_TRUE(std::all_of(got.marks_after.begin(), got.marks_after.end(),
                                [](int32_t m) { return m == 0; }));
      }
    }
  }
}

TEST(CudaSampling, RefusesTooManyTopLogits) {
  EXPECT_FALSE(sampling_supports(1000, kSamplingMaxTopLogits + 1));
  EXPECT_FALSE(sampling_supports(10, 11));
  EXPECT_TRUE(sampling_supports(1000, kSamplingMaxTopLogits));
  EXPECT_TRUE(sampling_supports(kSamplingMaxVocab, 0));
  EXPECT_FALSE(sampling_supports(kSamplingMaxVocab + 1, 0));
}

}  // namespace
}  // namespace litellama

namespace litellama {
namespace {

// A float rounded to bfloat16 (nearest even), as a bf16 model's logits are valued.
float to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

// Logprobs of the device sampler against a double-precision log-softmax of the raw logits, for
// fp32 and bf16-valued logits, greedy rows (the argmax kernel is not used then), sampled rows and
// rows whose penalties pick an id they changed; launched directly and replayed from a captured
// CUDA graph (twice, with the penalty marks reset by the sampler itself in between). The sampled
// ids are the CPU sampler's.
TEST(CudaSampling, LogprobsMatchCpuLogSoftmaxInAndOutOfGraphs) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(41);
  const int32_t vocab = 128256;
  const int32_t n_top = 5;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 logits" : "fp32 logits");
    std::vector<RowCase> cases(6);
    cases[1].params.temperature = 0.9f;
    cases[1].params.top_p = 0.9f;
    cases[1].params.seed = 4;
    cases[2].params.temperature = 1.4f;
    cases[2].params.top_k = 50;
    cases[2].params.repetition_penalty = 1.3f;
    cases[2].params.seed = 5;
    cases[2].prompt = {1, 2, 3};
    cases[2].generated = {7, 7};
    cases[3].params.presence_penalty = -1000.0f;  // greedy onto a penalised (boosted) id
    cases[3].generated = {12345};
    cases[3].n_generated = 1;
    cases[4].params.frequency_penalty = 0.5f;
    cases[4].params.temperature = 0.7f;
    cases[4].params.seed = 6;
    cases[4].generated = {5, 6, 5};
    cases[4].n_generated = 3;
    const auto n_rows = static_cast<int32_t>(cases.size());
    std::vector<float> logits = normal_logits(static_cast<size_t>(n_rows) * vocab, 3.0f, rng);
    if (bf16) {
      for (float& l : logits) l = to_bf16(l);
    }

    // CPU reference: ids from the CPU sampler, logprobs from a double log-softmax.
    std::vector<int32_t> cpu_ids(static_cast<size_t>(n_rows));
    std::vector<double> lse(static_cast<size_t>(n_rows));
    for (int32_t r = 0; r < n_rows; ++r) {
      std::vector<float> row(logits.begin() + static_cast<int64_t>(r) * vocab,
                             logits.begin() + static_cast<int64_t>(r + 1) * vocab);
      double max = -INFINITY;
      for (float l : row) max = std::max(max, static_cast<double>(l));
      double total = 0;
      for (float l : row) total += std::exp(static_cast<double>(l) - max);
      lse[static_cast<size_t>(r)] = max + std::log(total);
      SamplingInput in;
      in.prompt_ids = cases[static_cast<size_t>(r)].prompt;
      in.generated_ids = cases[static_cast<size_t>(r)].generated;
      in.n_generated = cases[static_cast<size_t>(r)].n_generated;
      cpu_ids[static_cast<size_t>(r)] = sample_token(row, cases[static_cast<size_t>(r)].params, in);
    }
    EXPECT_EQ(cpu_ids[3], 12345);

    std::vector<SamplingRow> rows;
    std::vector<int32_t> history;
    pack_rows(cases, &rows, &history);
    DevBuf d_logits = upload(logits), d_rows = upload(rows), d_hist = upload(history);
    DevBuf d_sampled(static_cast<size_t>(n_rows) * 4);
    DevBuf d_top_ids(static_cast<size_t>(n_rows) * n_top * 4);
    DevBuf d_top_values(static_cast<size_t>(n_rows) * n_top * 4);
    DevBuf d_lp(static_cast<size_t>(n_rows) * 4), d_lse(static_cast<size_t>(n_rows) * 4);
    DevBuf d_raw(history.size() * 4 + 4);
    const size_t marks_bytes = sampling_workspace_size_bytes(n_rows, vocab);
    DevBuf d_marks(marks_bytes);
    ASSERT_EQ(cudaMemset(d_marks.get(), 0, marks_bytes), cudaSuccess);
    SamplingLogprobs lp;
    lp.logprobs = d_lp.as<float>();
    lp.lse = d_lse.as<float>();
    lp.history_raw = d_raw.as<float>();
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto launch = [&] {
      return launch_sampling(d_sampled.as<int32_t>(), d_top_ids.as<int32_t>(),
                             d_top_values.as<float>(), d_logits.as<float>(),
                             d_rows.as<SamplingRow>(), d_hist.as<int32_t>(), n_rows, vocab, n_top,
                             d_marks.as<int32_t>(), stream, /*greedy_only=*/false, 0, lp);
    };
    auto check = [&](const char* how) {
      SCOPED_TRACE(how);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto ids = download<int32_t>(d_sampled, static_cast<size_t>(n_rows));
      const auto got_lp = download<float>(d_lp, static_cast<size_t>(n_rows));
      const auto got_lse = download<float>(d_lse, static_cast<size_t>(n_rows));
      const auto top_ids = download<int32_t>(d_top_ids, static_cast<size_t>(n_rows) * n_top);
      const auto top_values = download<float>(d_top_values, static_cast<size_t>(n_rows) * n_top);
      for (int32_t r = 0; r < n_rows; ++r) {
        const auto s = static_cast<size_t>(r);
        EXPECT_EQ(ids[s], cpu_ids[s]) << "row " << r;
        EXPECT_NEAR(got_lse[s], lse[s], 2e-5 * std::max(1.0, std::abs(lse[s]))) << "row " << r;
        const double raw = logits[static_cast<size_t>(r) * vocab + static_cast<size_t>(ids[s])];
        EXPECT_NEAR(got_lp[s], raw - lse[s], 2e-5 * std::max(1.0, std::abs(lse[s]))) << "row " << r;
        for (int32_t k = 0; k < n_top; ++k) {
          const size_t i = s * n_top + static_cast<size_t>(k);
          const double want = logits[static_cast<size_t>(r) * vocab + top_ids[i]] - lse[s];
          EXPECT_NEAR(top_values[i] - got_lse[s], want, 2e-5 * std::max(1.0, std::abs(lse[s])));
        }
      }
    };
    // Each launch penalises the logits in place: start every run from the raw ones.
    auto reset_logits = [&] {
      ASSERT_EQ(cudaMemcpyAsync(d_logits.get(), logits.data(), logits.size() * 4,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
    };
    reset_logits();
    ASSERT_TRUE(launch().is_ok());
    check("direct launch");

    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status captured = launch();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(captured.is_ok()) << captured.to_string();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_EQ(cudaMemsetAsync(d_lp.get(), 0xff, static_cast<size_t>(n_rows) * 4, stream),
                cudaSuccess);
      reset_logits();
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      check("graph replay");
    }
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
    (void)cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace litellama
