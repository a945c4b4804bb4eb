// The calibration pass of `litellama quantize`: activation statistics of every projection input
// over a calibration text, and the two published uses of them.
//   AWQ (Lin et al., "AWQ: Activation-aware Weight Quantization", 2023, with AutoAWQ's default
//     "duo" scaling): per input channel s = mean|x|^alpha / (mean|w~|^(1 - alpha) + 1e-4), where
//     w~ is each weight divided by the largest |w| of its quantization group; s is normalized by
//     sqrt(max(s) * min(s)), and alpha searched on a grid of 20 values in [0, 1) for the least
//     output error of the quantized projections, || (X / s) (Q(W s) - W s)^T ||^2 over the
//     sampled rows X (AutoAWQ measures the whole attention or MLP block's output instead). The
//     weights are multiplied by s and the operation before them (the RMSNorm, up_proj for
//     down_proj, v_proj for o_proj) divided by it, which leaves the model's function unchanged
//     before quantization. o_proj is scaled only where v_proj's output is o_proj's input channel
//     for channel (no grouped-query attention, no v bias), as in AutoAWQ. alpha = 0 with s = 1 is
//     also tried, so on the sample the search never does worse than plain rounding. AutoAWQ's
//     weight-clipping search is not run.
//   SmoothQuant (Xiao et al., 2023, as llm-compressor computes it): s = r^alpha /
//     (2 max|W|)^(1 - alpha) per input channel, with r the activation's range (max - min) over
//     the calibration tokens and the weight maximum over the projections sharing the input;
//     s = r where that weight column is all zero; alpha 0.5. Folded the same way into the input
//     and post-attention norms, it moves the activations' outlier range into the weights before
//     int8 quantization.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cpu_model_runner.h"

namespace litellama {

// Statistics of one projection input of one layer.
struct InputStats {
  int64_t dim = 0;
  int64_t rows = 0;
  std::vector<double> abs_sum;  // per channel: sum of |x|
  std::vector<float> abs_max;   // per channel: max |x|
  std::vector<float> min, max;  // per channel: signed extremes
  std::vector<float> samples;   // the first sample_rows rows, row-major [sample_rows, dim]
  int64_t sample_rows = 0;

  void add(const float* x, int64_t n, int64_t d, int64_t max_sample_rows);
  std::vector<float> abs_mean() const;
};

// One per ProjectionInput (kQkv, kO, kGateUp, kDown).
using LayerStats = std::array<InputStats, 4>;

// Runs `checkpoint` (unquantized, on the CPU backend) over each calibration sequence and collects
// the statistics of every layer, keeping up to `max_sample_rows` rows of each input.
Result<std::vector<LayerStats>> calibrate(const Checkpoint& checkpoint,
                                          const std::vector<std::vector<int32_t>>& sequences,
                                          int64_t max_sample_rows);

// A projection's dense weight [n, k], row-major, as calibration edits it.
struct DenseWeight {
  std::vector<float>* w;
  int64_t n;
  int64_t k;
};

// AWQ's scale search for projections sharing one input (their k equal to stats.dim), quantized in
// groups of `group` input columns; `quantize` turns a row-major [n, k] weight into its
// dequantized quantization. Returns s (size k).
std::vector<float> awq_search_scales(
    const InputStats& stats, const std::vector<DenseWeight>& weights, int64_t group,
    const std::function<std::vector<float>(const std::vector<float>&, int64_t, int64_t)>& quantize);

// SmoothQuant's scales for projections sharing one input.
std::vector<float> smoothquant_scales(const InputStats& stats,
                                      const std::vector<DenseWeight>& weights, double alpha);

// Multiplies column j of every weight by s[j].
void scale_columns(const std::vector<DenseWeight>& weights, const std::vector<float>& s);

}  // namespace litellama
