// Offline quantization: writes a quantized copy of an unquantized checkpoint in one of the
// layouts the loader reads (services/worker/quant_config.h), so that a user without internet
// access can make one. Only the decoder layers' seven projections are quantized; embeddings,
// norms, biases, the LM head and any vision tower are copied as stored, and config.json gains
// the quantization_config that says so.
//   gptq-rtn  round to nearest, GPTQ layout: 4 bits, asymmetric, per group of input rows, with
//             the published GPTQ quantizer's range (the group's min and max widened to take 0)
//             and no error feedback; zero points stored less one (checkpoint_format "gptq").
//   fp8       compressed-tensors float-quantized: e4m3 weights, one float32 scale per output
//             channel (its largest |w| / 448), activations quantized per token at run time.
//   awq       AutoAWQ's GEMM layout: 4 bits, zero point, per group; per-channel scales from the
//             activation-aware search over the calibration text (services/worker/calibration.h)
//             folded into the norms and up_proj before AutoAWQ's quantizer (each group's min
//             and max).
//   w8a8      compressed-tensors int-quantized: SmoothQuant's smoothing (alpha 0.5) folded into
//             the norms, then int8 weights with one scale per output channel (largest |w| /
//             127.5), activations quantized per token at run time.
// The calibration runs the unquantized model on the CPU backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "services/worker/model_config.h"

namespace litellama {

enum class QuantizeMethod { kGptqRtn, kFp8, kAwq, kW8a8 };

// "gptq-rtn", "fp8", "awq", "w8a8"
Result<QuantizeMethod> quantize_method_from_name(const std::string& name);

struct QuantizeOptions {
  QuantizeMethod method = QuantizeMethod::kGptqRtn;
  int32_t group_size = 128;  // gptq-rtn: input rows per group (-1: one group per column)
  // awq, w8a8: the calibration text's token ids, in sequences run one at a time
  std::vector<std::vector<int32_t>> calibration_ids;
};

struct QuantizeReport {
  int32_t modules = 0;         // projections quantized
  int64_t bytes_in = 0;        // of all tensors as read
  int64_t bytes_out = 0;       // of all tensors as written
  double max_abs_error = 0.0;  // largest |dequantized - original| over quantized weights
};

// The quantization_config that a checkpoint quantized with `options` declares (config.json).
nlohmann::json quantization_config(const QuantizeOptions& options, const ModelConfig& model);

// Reads the checkpoint in `in_dir` (unquantized), writes the quantized one to `out_dir` (created;
// must not hold a checkpoint already). Other files of in_dir (tokenizer, generation config, chat
// template, image processor) are copied.
Result<QuantizeReport> quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                           const QuantizeOptions& options);

}  // namespace litellama
