// QuantConfig: the `quantization_config` of a Hugging Face config.json, for the four published
// layouts the engine loads (docs/quantization.md describes each field by field):
//   awq   AutoAWQ's GEMM layout: 4-bit weights packed along the output dimension in AutoAWQ's
//         nibble order, zero points and fp16 scales per group of input rows.
//   gptq  GPTQ's layout: 4- or 8-bit weights packed along the input dimension, zero points
//         packed along the output dimension (stored less one unless the checkpoint format is
//         gptq_v2), fp16 scales per group, g_idx mapping input rows to groups (act-order).
//   fp8   compressed-tensors float-quantized: e4m3 weights with a per-tensor or per-channel
//         scale, activations quantized per token (dynamic) or with a static per-tensor scale.
//   int8  compressed-tensors int-quantized W8A8 (SmoothQuant as llm-compressor writes it):
//         int8 weights with per-channel scales, activations quantized per token.
// Anything else (other methods, bit widths, packings or strategies) is refused at parse time
// with the field named, so a backend never meets a layout it does not understand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace litellama {

enum class QuantMethod { kNone, kAwq, kGptq, kFp8, kInt8 };

const char* quant_method_name(QuantMethod method);

// How a weight or activation scale is shared: one for the tensor, one per output channel (row),
// or one per token (activations, computed at run time).
enum class ScaleStrategy { kTensor, kChannel, kToken };

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  int32_t bits = 16;
  // awq, gptq: input rows per scale/zero group; equal to the input size when the config says -1.
  // Kept as written (-1 allowed); group_rows() resolves it for a given input size.
  int32_t group_size = -1;
  // gptq: zero points are all 2^(bits-1) (symmetric) or stored per group (asymmetric).
  bool symmetric = true;
  // gptq: desc_act (act-order): g_idx is a permutation-like map instead of row / group_size.
  bool act_order = false;
  // gptq: zero points are stored minus one (the original GPTQ format, "gptq"); "gptq_v2" stores
  // them as they are.
  bool zeros_minus_one = true;
  // fp8, int8
  ScaleStrategy weight_scale = ScaleStrategy::kChannel;
  // fp8, int8: activations quantized per token at run time (dynamic), with one static per-tensor
  // scale from the checkpoint (input_scale), or not at all (weight-only, W8A16).
  bool activations_quantized = false;
  bool input_dynamic = true;
  // Modules left unquantized: AWQ's modules_to_not_convert (a module is skipped when any entry
  // occurs in its name), compressed-tensors' ignore (a module name, or "re:" and a regular
  // expression matched from the start of the name, as Python's re.match).
  std::vector<std::string> not_converted;
  std::vector<std::string> ignore;

  int64_t group_rows(int64_t in_features) const {
    return group_size <= 0 ? in_features : group_size;
  }
};

// Parses config.json's quantization_config (or compression_config, the older name of
// compressed-tensors checkpoints; absent or null: method kNone). Errors name the field.
Result<QuantConfig> parse_quant_config(const nlohmann::json& config_json);

// Whether the linear module `module` (a tensor name without ".weight", e.g.
// "model.layers.0.self_attn.q_proj") is stored quantized under `config`.
bool module_is_quantized(const QuantConfig& config, const std::string& module);

}  // namespace litellama
