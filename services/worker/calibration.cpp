#include "services/worker/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "services/worker/offline_engine.h"

namespace litellama {

void InputStats::add(const float* x, int64_t n, int64_t d, int64_t max_sample_rows) {
  if (dim == 0) {
    dim = d;
    abs_sum.assign(static_cast<size_t>(d), 0.0);
    abs_max.assign(static_cast<size_t>(d), 0.0f);
    min.assign(static_cast<size_t>(d), std::numeric_limits<float>::infinity());
    max.assign(static_cast<size_t>(d), -std::numeric_limits<float>::infinity());
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * d;
    for (int64_t j = 0; j < d; ++j) {
      const auto c = static_cast<size_t>(j);
      const float a = std::fabs(row[j]);
      abs_sum[c] += a;
      abs_max[c] = std::max(abs_max[c], a);
      min[c] = std::min(min[c], row[j]);
      max[c] = std::max(max[c], row[j]);
    }
  }
  rows += n;
  const int64_t take = std::min(n, max_sample_rows - sample_rows);
  if (take > 0) {
    samples.insert(samples.end(), x, x + take * d);
    sample_rows += take;
  }
}

std::vector<float> InputStats::abs_mean() const {
  std::vector<float> m(static_cast<size_t>(dim));
  for (int64_t j = 0; j < dim; ++j) {
    m[static_cast<size_t>(j)] =
        rows > 0 ? static_cast<float>(abs_sum[static_cast<size_t>(j)] / static_cast<double>(rows))
                 : 0.0f;
  }
  return m;
}

Result<std::vector<LayerStats>> calibrate(const Checkpoint& checkpoint,
                                          const std::vector<std::vector<int32_t>>& sequences,
                                          int64_t max_sample_rows) {
  if (sequences.empty()) {
    return make_error(StatusCode::kInvalidArgument, "calibration: no calibration tokens");
  }
  std::vector<LayerStats> stats(static_cast<size_t>(checkpoint.config().n_layers));
  size_t longest = 0;
  for (const auto& s : sequences) longest = std::max(longest, s.size());
  RunnerOptions options;
  options.n_kv_slots = static_cast<int32_t>(longest) + 8;
  options.max_batch_tokens = static_cast<int32_t>(longest) + 8;
  LITELLAMA_ASSIGN_OR_RETURN(
      auto runner,
      create_observed_cpu_model_runner(
          checkpoint, options,
          [&](int32_t layer, ProjectionInput input, const float* x, int64_t rows, int64_t dim) {
            stats[static_cast<size_t>(layer)][static_cast<size_t>(input)].add(x, rows, dim,
                                                                              max_sample_rows);
          }));
  OfflineEngine engine(*runner);
  for (const auto& sequence : sequences) {
    GenerationRequest r;
    r.prompt_ids = sequence;
    r.max_new_tokens = 1;  // the prompt's prefill is the pass; its one token ends the request
    LITELLAMA_ASSIGN_OR_RETURN(auto results, engine.generate({r}));
    (void)results;
  }
  return stats;
}

namespace {

// || (X / s) D^T ||^2 where D = Q(W s) - W s: the output error of the quantized, scaled group.
double scaled_output_error(const InputStats& x, const std::vector<float>& s,
                           const std::vector<float>& diff, int64_t n, int64_t k) {
  double err = 0.0;
  std::vector<float> xs(static_cast<size_t>(k));
  for (int64_t r = 0; r < x.sample_rows; ++r) {
    const float* row = x.samples.data() + r * k;
    for (int64_t j = 0; j < k; ++j) xs[static_cast<size_t>(j)] = row[j] / s[static_cast<size_t>(j)];
    for (int64_t o = 0; o < n; ++o) {
      const float* d = diff.data() + o * k;
      double acc = 0.0;
      for (int64_t j = 0; j < k; ++j) acc += static_cast<double>(xs[static_cast<size_t>(j)]) * d[j];
      err += acc * acc;
    }
  }
  return err;
}

}  // namespace

namespace {

// AutoAWQ's w_mean: per input channel, the mean over output rows of |w| / (the largest |w| of its
// quantization group + 1e-6), over all projections sharing the input.
std::vector<float> awq_weight_mean(const std::vector<DenseWeight>& weights, int64_t k,
                                   int64_t group) {
  std::vector<double> sum(static_cast<size_t>(k), 0.0);
  int64_t rows = 0;
  for (const DenseWeight& dw : weights) {
    const int64_t g = group <= 0 ? dw.k : group;
    for (int64_t o = 0; o < dw.n; ++o) {
      const float* w = dw.w->data() + o * dw.k;
      for (int64_t start = 0; start < dw.k; start += g) {
        const int64_t end = std::min(start + g, dw.k);
        float amax = 0.0f;
        for (int64_t j = start; j < end; ++j) amax = std::max(amax, std::fabs(w[j]));
        for (int64_t j = start; j < end; ++j) {
          sum[static_cast<size_t>(j)] += std::fabs(w[j]) / (amax + 1e-6f);
        }
      }
    }
    rows += dw.n;
  }
  std::vector<float> mean(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    mean[static_cast<size_t>(j)] = static_cast<float>(sum[static_cast<size_t>(j)] / rows);
  }
  return mean;
}

}  // namespace

std::vector<float> awq_search_scales(
    const InputStats& stats, const std::vector<DenseWeight>& weights, int64_t group,
    const std::function<std::vector<float>(const std::vector<float>&, int64_t, int64_t)>&
        quantize) {
  constexpr int kGrid = 20;
  const int64_t k = stats.dim;
  const std::vector<float> x_mean = stats.abs_mean();
  const std::vector<float> w_mean = awq_weight_mean(weights, k, group);
  auto error_of = [&](const std::vector<float>& s) {
    double err = 0.0;
    for (const DenseWeight& dw : weights) {
      std::vector<float> ws(dw.w->size());
      for (int64_t o = 0; o < dw.n; ++o) {
        for (int64_t j = 0; j < dw.k; ++j) {
          ws[static_cast<size_t>(o * dw.k + j)] =
              (*dw.w)[static_cast<size_t>(o * dw.k + j)] * s[static_cast<size_t>(j)];
        }
      }
      std::vector<float> diff = quantize(ws, dw.n, dw.k);
      for (size_t i = 0; i < diff.size(); ++i) diff[i] -= ws[i];
      err += scaled_output_error(stats, s, diff, dw.n, dw.k);
    }
    return err;
  };
  std::vector<float> best(static_cast<size_t>(k), 1.0f);
  double best_err = error_of(best);
  for (int step = 0; step < kGrid; ++step) {
    const double alpha = static_cast<double>(step) / kGrid;
    std::vector<float> s(static_cast<size_t>(k));
    float hi = 0.0f, lo = std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < k; ++j) {
      const auto c = static_cast<size_t>(j);
      const double v = std::pow(static_cast<double>(x_mean[c]), alpha) /
                       (std::pow(static_cast<double>(w_mean[c]), 1.0 - alpha) + 1e-4);
      s[c] = std::max(static_cast<float>(v), 1e-4f);
      hi = std::max(hi, s[c]);
      lo = std::min(lo, s[c]);
    }
    const float norm = std::sqrt(hi * lo);
    for (float& v : s) v /= norm;
    const double err = error_of(s);
    if (err < best_err) {
      best_err = err;
      best = s;
    }
  }
  return best;
}

std::vector<float> smoothquant_scales(const InputStats& stats,
                                      const std::vector<DenseWeight>& weights, double alpha) {
  const int64_t k = stats.dim;
  std::vector<float> s(static_cast<size_t>(k), 1.0f);
  for (int64_t j = 0; j < k; ++j) {
    const auto c = static_cast<size_t>(j);
    float w_max = 0.0f;
    for (const DenseWeight& dw : weights) {
      for (int64_t o = 0; o < dw.n; ++o) {
        w_max = std::max(w_max, std::fabs((*dw.w)[static_cast<size_t>(o * dw.k + j)]));
      }
    }
    const double range = stats.rows > 0 ? static_cast<double>(stats.max[c]) - stats.min[c] : 0.0;
    const double v =
        w_max > 0.0f ? std::pow(range, alpha) / std::pow(2.0 * w_max, 1.0 - alpha) : range;
    s[c] = std::max(static_cast<float>(v), 1e-5f);
  }
  return s;
}

void scale_columns(const std::vector<DenseWeight>& weights, const std::vector<float>& s) {
  for (const DenseWeight& dw : weights) {
    for (int64_t o = 0; o < dw.n; ++o) {
      for (int64_t j = 0; j < dw.k; ++j)
        (*dw.w)[static_cast<size_t>(o * dw.k + j)] *= s[static_cast<size_t>(j)];
    }
  }
}

}  // namespace litellama
