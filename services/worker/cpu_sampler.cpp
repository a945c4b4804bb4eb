#include "services/worker/cpu_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "common/splitmix64.h"

namespace litellama {

double sampling_uniform(uint64_t seed, int64_t n_generated) {
  const uint64_t r =
      splitmix64(splitmix64(seed) ^ splitmix64(static_cast<uint64_t>(n_generated) + 0x5851f42dull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

std::vector<std::pair<int32_t, float>> top_logits(std::span<const float> logits, int32_t n) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min<int32_t>(n, static_cast<int32_t>(logits.size()));
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out.emplace_back(ids[i], logits[ids[i]]);
  return out;
}

float log_sum_exp(std::span<const float> logits) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_logit = std::max(max_logit, l);
  double total = 0;
  for (float l : logits) total += static_cast<double>(std::exp(l - max_logit));
  return max_logit + std::log(static_cast<float>(total));
}

int32_t sample_token(std::span<float> logits, const SamplingParams& params,
                     const SamplingInput& input) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (params.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(input.prompt_ids.begin(), input.prompt_ids.end());
    seen.insert(input.generated_ids.begin(), input.generated_ids.end());
    for (int32_t id : seen) {
      float& l = logits[id];
      l = l > 0 ? l / params.repetition_penalty : l * params.repetition_penalty;
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t id : input.generated_ids) ++counts[id];
    for (const auto& [id, count] : counts) {
      logits[id] -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
    }
  }
  if (params.is_greedy()) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }

  // Candidates in descending logit order (ties: lower id first); top-k trims before sorting all.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t n = ids.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    std::nth_element(ids.begin(), ids.begin() + params.top_k - 1, ids.end(), better);
    const float kth = logits[ids[params.top_k - 1]];
    // Values tied with the k-th survive, as in the reference implementation.
    n = static_cast<size_t>(
        std::partition(ids.begin(), ids.end(), [&](int32_t id) { return logits[id] >= kth; }) -
        ids.begin());
  }
  std::sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), better);

  const double inv_t = 1.0 / params.temperature;
  std::vector<double> probs(n);
  const double max_logit = logits[ids[0]] * inv_t;
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp(logits[ids[i]] * inv_t - max_logit);
    total += probs[i];
  }
  for (auto& p : probs) p /= total;
  if (params.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += probs[keep++];
      if (cum >= params.top_p) break;
    }
    // Values tied with the one that reaches top_p survive, as with top-k: the kept set is defined
    // by value, never by the ids' order among equal logits (the device sampler selects by value).
    while (keep > 0 && keep < n && logits[ids[keep]] == logits[ids[keep - 1]]) ++keep;
    n = std::max<size_t>(keep, 1);
  }
  if (params.min_p > 0.0f) {
    const double threshold = params.min_p * probs[0];
    size_t keep = 1;
    while (keep < n && probs[keep] >= threshold) ++keep;
    n = keep;
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += probs[i];
  const double u = sampling_uniform(params.seed, input.n_generated) * kept;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += probs[i];
    if (u < cum) return ids[i];
  }
  return ids[n - 1];
}

}  // namespace litellama
