// Sampling on the CPU: the reference for the device sampler and the CPU backend's own. One
// sequence's last-position logits in, one token id out, following SamplingParams' order.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/proto/sampling_params.h"

namespace litellama {

// Uniform draw in [0, 1) for the n-th generated token of a request with this seed.
double sampling_uniform(uint64_t seed, int64_t n_generated);

// The n largest values of `logits` as (id, value), largest first; ties go to the lower id.
std::vector<std::pair<int32_t, float>> top_logits(std::span<const float> logits, int32_t n);

// Log-sum-exp of `logits` as the device sampler computes it: the maximum, then the sum of
// exp(logit - maximum) in fp32 (added up in double), so a logit less it is its log-softmax.
float log_sum_exp(std::span<const float> logits);

struct SamplingInput {
  std::span<const int32_t> prompt_ids;     // for the repetition penalty
  std::span<const int32_t> generated_ids;  // for all penalties
  int64_t n_generated = 0;                 // keys the draw
};

// Samples one id. `logits` is modified in place (penalties, temperature). Greedy picks the
// lowest id among equal maxima.
int32_t sample_token(std::span<float> logits, const SamplingParams& params,
                     const SamplingInput& input);

}  // namespace litellama
