// Helpers of the CUDA runner tests: a temporary directory, runner options, greedy generation over
// a runner step by step with top logits, random requests over shuffled slots, and comparisons of
// top logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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
#include "tests/gpu/gpu_test_util.h"

namespace litellama::runner_test {

namespace fs = std::filesystem;
using TopLogits = std::vector<std::pair<int32_t, float>>;

inline constexpr int32_t kTop = 8;

class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = fs::temp_directory_path() /
            ("litellama_cuda_runner_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

inline RunnerOptions runner_options(Device device, DType dtype) {
  RunnerOptions o;
  o.device = device;
  o.compute_dtype = dtype;
  o.n_kv_slots = 1024;
  o.max_batch_tokens = 512;
  o.max_batch_seqs = 16;
  o.n_threads = 0;
  return o;
}

// What a generation produced, per sequence and step.
struct Trace {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<TopLogits>> tops;
};

struct Request {
  std::vector<int32_t> prompt;
  std::vector<int32_t> slots;  // for prompt + generated positions
};

// Greedy generation of n_new tokens per request. start_step[i]: the step at which request i's
// prompt is prefilled (all prompts in one step when all zero, a later start mixes its prefill with
// the others' decode steps).
inline Result<Trace> generate(ModelRunner& runner, const std::vector<Request>& requests,
                              int32_t n_new, const std::vector<int32_t>& start_step) {
  const size_t n = requests.size();
  Trace trace;
  trace.ids.resize(n);
  trace.tops.resize(n);
  std::vector<std::vector<int32_t>> tokens(n);  // prompt + generated
  std::vector<int32_t> n_cached(n, 0);
  for (int32_t step = 0;; ++step) {
    StepBatch batch;
    batch.n_top_logits = kTop;
    std::vector<size_t> in_batch;
    for (size_t i = 0; i < n; ++i) {
      if (step < start_step[i] || static_cast<int32_t>(trace.ids[i].size()) >= n_new) continue;
      if (tokens[i].empty()) tokens[i] = requests[i].prompt;
      const auto kv = static_cast<int32_t>(tokens[i].size());
      const std::span<const int32_t> new_tokens(tokens[i].data() + n_cached[i],
                                                static_cast<size_t>(kv - n_cached[i]));
      const std::span<const int32_t> slots(requests[i].slots.data(), static_cast<size_t>(kv));
      batch.add_sequence(new_tokens, slots, true, SamplingParams{},
                         static_cast<int32_t>(trace.ids[i].size()));
      in_batch.push_back(i);
      n_cached[i] = kv;
    }
    if (in_batch.empty()) {
      bool all_done = true;
      for (size_t i = 0; i < n; ++i) {
        all_done = all_done && static_cast<int32_t>(trace.ids[i].size()) >= n_new;
      }
      if (all_done) break;
      continue;
    }
    StepOutput out;
    LITELLAMA_RETURN_IF_ERROR(runner.step(batch, &out));
    for (size_t b = 0; b < in_batch.size(); ++b) {
      const size_t i = in_batch[b];
      trace.ids[i].push_back(out.sampled_ids[b]);
      trace.tops[i].push_back(out.top_logits[b]);
      tokens[i].push_back(out.sampled_ids[b]);
    }
  }
  return trace;
}

// generate() on a new CUDA runner made with `options`, for a runner used only for that.
inline Result<Trace> generate_on_cuda(const Checkpoint& ckpt, const RunnerOptions& options,
                                      const std::vector<Request>& requests, int32_t n_new,
                                      const std::vector<int32_t>& start_step) {
  LITELLAMA_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                             create_cuda_model_runner(ckpt, options));
  return generate(*runner, requests, n_new, start_step);
}

inline std::vector<Request> make_requests(const std::vector<int32_t>& prompt_lens, int32_t n_new,
                                          int32_t vocab, int32_t n_slots, std::mt19937& rng) {
  std::vector<int32_t> perm(static_cast<size_t>(n_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<Request> requests;
  size_t next = 0;
  for (int32_t len : prompt_lens) {
    Request r;
    for (int32_t i = 0; i < len; ++i) r.prompt.push_back(id(rng));
    r.slots.assign(perm.begin() + static_cast<std::ptrdiff_t>(next),
                   perm.begin() + static_cast<std::ptrdiff_t>(next + len + n_new));
    next += static_cast<size_t>(len + n_new);
    requests.push_back(std::move(r));
  }
  return requests;
}

// Top logits agree: values rank by rank within rel_tol * max(1e-3, |ref|) (as a fraction of the
// largest |ref| value), ids equal unless the reference has a near tie at that rank.
inline ::testing::AssertionResult tops_close(const TopLogits& got, const TopLogits& ref,
                                             double rel_tol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << ref.size();
  }
  double scale = 0;
  for (const auto& [id, v] : ref) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  const double tol = rel_tol * std::max(scale, 1e-3);
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i].second) || std::fabs(got[i].second - ref[i].second) > tol) {
      return ::testing::AssertionFailure() << "rank " << i << ": " << got[i].second << " vs "
                                           << ref[i].second << " (tol " << tol << ")";
    }
    if (got[i].first != ref[i].first) {
      // The last rank's rival may be just outside the list: its value matched (checked above).
      const bool near_tie = (i > 0 && ref[i - 1].second - ref[i].second <= 2 * tol) ||
                            i + 1 == ref.size() || ref[i].second - ref[i + 1].second <= 2 * tol;
      if (!near_tie) {
        return ::testing::AssertionFailure()
               << "rank " << i << ": id " << got[i].first << " vs " << ref[i].first;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline double max_rel_diff(const Trace& a, const Trace& b) {
  double worst = 0;
  for (size_t i = 0; i < a.tops.size(); ++i) {
    for (size_t s = 0; s < std::min(a.tops[i].size(), b.tops[i].size()); ++s) {
      for (size_t k = 0; k < std::min(a.tops[i][s].size(), b.tops[i][s].size()); ++k) {
        const double x = a.tops[i][s][k].second, y = b.tops[i][s][k].second;
        worst = std::max(worst, std::fabs(x - y) / std::max(1e-3, std::fabs(y)));
      }
    }
  }
  return worst;
}

}  // namespace litellama::runner_test
