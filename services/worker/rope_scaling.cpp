#include "services/worker/rope_scaling.h"

#include <algorithm>
#include <cmath>

namespace litellama {

namespace {

constexpr double kPi = 3.14159265358979323846;

// base^(-2i/d) as float32, the way the reference computes it (float32 power of a float32
// exponent, then a float32 reciprocal).
std::vector<float> base_inv_freq(double base, int32_t dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int32_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = std::pow(static_cast<float>(base), exponent);
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq;
  }
  return inv;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_correction_dim(double n_rotations, int32_t dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (n_rotations * 2 * kPi))) / (2 * std::log(base));
}

}  // namespace

double rope_dynamic_base(const ModelConfig& config, int64_t seq_len) {
  const RopeConfig& r = config.rope;
  const double orig = static_cast<double>(r.original_max_position_embeddings);
  if (r.type != RopeScalingType::kDynamic || static_cast<double>(seq_len) <= orig) return r.theta;
  const double d = config.head_dim;
  return r.theta * std::pow((r.factor * static_cast<double>(seq_len) / orig) - (r.factor - 1.0),
                            d / (d - 2.0));
}

std::vector<float> rope_inv_freq(const ModelConfig& config, int64_t seq_len) {
  const RopeConfig& r = config.rope;
  const int32_t dim = config.head_dim;
  switch (r.type) {
    case RopeScalingType::kDefault:
      return base_inv_freq(r.theta, dim);
    case RopeScalingType::kLinear: {
      auto inv = base_inv_freq(r.theta, dim);
      for (auto& f : inv) f = f / static_cast<float>(r.factor);
      return inv;
    }
    case RopeScalingType::kDynamic:
      return base_inv_freq(rope_dynamic_base(config, seq_len), dim);
    case RopeScalingType::kLlama3: {
      auto inv = base_inv_freq(r.theta, dim);
      const double old_ctx = static_cast<double>(r.original_max_position_embeddings);
      const double low_freq_wavelen = old_ctx / r.low_freq_factor;
      const double high_freq_wavelen = old_ctx / r.high_freq_factor;
      for (auto& f : inv) {
        const float wavelen = static_cast<float>(2 * kPi) / f;
        float scaled = wavelen > low_freq_wavelen ? f / static_cast<float>(r.factor) : f;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float smooth = static_cast<float>((old_ctx / wavelen - r.low_freq_factor) /
                                                  (r.high_freq_factor - r.low_freq_factor));
          scaled = (1 - smooth) * scaled / static_cast<float>(r.factor) + smooth * scaled;
        }
        f = scaled;
      }
      return inv;
    }
    case RopeScalingType::kYarn: {
      const double orig = static_cast<double>(r.original_max_position_embeddings);
      double low = yarn_correction_dim(r.beta_fast, dim, r.theta, orig);
      double high = yarn_correction_dim(r.beta_slow, dim, r.theta, orig);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;
      std::vector<float> inv(static_cast<size_t>(dim / 2));
      for (int32_t i = 0; i < dim / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
        const float pos_freq = std::pow(static_cast<float>(r.theta), exponent);
        const float extrapolation = 1.0f / pos_freq;
        const float interpolation = 1.0f / (static_cast<float>(r.factor) * pos_freq);
        const float ramp = std::clamp(
            static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        inv[static_cast<size_t>(i)] =
            interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      return inv;
    }
  }
  return base_inv_freq(r.theta, dim);
}

float rope_attention_scaling(const ModelConfig& config) {
  const RopeConfig& r = config.rope;
  if (r.type != RopeScalingType::kYarn) return 1.0f;
  if (r.attention_factor > 0) return static_cast<float>(r.attention_factor);
  if (r.mscale != 0 && r.mscale_all_dim != 0) {
    return static_cast<float>(yarn_mscale(r.factor, r.mscale) /
                              yarn_mscale(r.factor, r.mscale_all_dim));
  }
  return static_cast<float>(yarn_mscale(r.factor, 1.0));
}

}  // namespace litellama
