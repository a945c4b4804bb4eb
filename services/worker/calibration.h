// The calibration pass of `litellama quantize`: activation statistics of every projection input
// over a calibration text, and the two published uses of them.
//   AWQ (Lin et al., "AWQ: Activation-aware Weight Quantization", 2023): per input channel
//     scales s = mean|x|^alpha, normalized by sqrt(max(s) * min(s)); alpha is searched on a grid
//     of 20 values in [0, 1) for the least output error of the quantized group,
//     || (X / s) (Q(W s) - W s)^T ||^2 over the sampled rows X; the weights are multiplied by s
//     and the operation before them (the RMSNorm, or up_proj for down_proj) divided by it, which
//     leaves the model's function unchanged before quantization. alpha = 0 (no scaling, plain
//     round to nearest) is among the candidates, so the search never does worse than it on the
//     sample. As AutoAWQ does for grouped-query attention, o_proj keeps s = 1, and the weight
//     clipping search is not run.
//   SmoothQuant (Xiao et al., 2023): s = max|x|^alpha / max|W|^(1 - alpha) per input channel,
//     alpha 0.5, folded the same way into the input and post-attention norms, which moves the
//     activations' outlier range into the weights before int8 quantization.
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

// AWQ's scale search for projections sharing one input (their k equal to stats.dim); `quantize`
// turns a row-major [n, k] weight into its dequantized quantization. Returns s (size k).
std::vector<float> awq_search_scales(
    const InputStats& stats, const std::vector<DenseWeight>& weights,
    const std::function<std::vector<float>(const std::vector<float>&, int64_t, int64_t)>& quantize);

// SmoothQuant's scales for projections sharing one input.
std::vector<float> smoothquant_scales(const InputStats& stats,
                                      const std::vector<DenseWeight>& weights, double alpha);

// Multiplies column j of every weight by s[j].
void scale_columns(const std::vector<DenseWeight>& weights, const std::vector<float>& s);

}  // namespace litellama
