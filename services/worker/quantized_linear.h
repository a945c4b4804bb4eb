// The tensors of one quantized linear module (nn.Linear with out_features N and in_features K) in
// each layout QuantConfig accepts, their checks, and their dequantization to the dense float32
// weight [N, K] that an unquantized checkpoint stores as "<module>.weight". docs/quantization.md
// describes the layouts field by field; tests/golden/make_quant_golden.py is an independent
// unpacker of the same layouts whose results quantized_linear_test compares bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "services/worker/quant_config.h"
#include "services/worker/tensor_view.h"

namespace litellama {

// One tensor a quantized module stores: its name, the shapes accepted (scales may be written
// [N, 1] or [N], a per-tensor scale [1] or []), the dtypes accepted, and whether it may be absent.
struct QuantTensorSpec {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes;
  bool optional = false;
};

// The tensors of `module` (e.g. "model.layers.0.mlp.down_proj") under `config`, or an error when
// its N and K do not fit the layout (packing and group divisibility).
Result<std::vector<QuantTensorSpec>> quantized_linear_specs(const QuantConfig& config,
                                                            const std::string& module, int64_t n,
                                                            int64_t k);

// A tensor of the checkpoint by name (kNotFound when absent).
using TensorLookup = std::function<Result<TensorView>(const std::string&)>;

// Dequantizes `module` to float32 [N, K] row-major. Every value is computed in float32 from the
// stored integers and scales as the layout defines it (one subtraction of integers, one float32
// product), so any correct unpacker gets the same bits. Tensors must have passed the specs.
Result<std::vector<float>> dequantize_linear(const QuantConfig& config, const std::string& module,
                                             int64_t n, int64_t k, const TensorLookup& lookup);

// A 4-bit AWQ or GPTQ module without act-order as integers in the dense weight's [n, k] order:
// W[col, row] = (codes[col, row] - zeros[col, row / group]) * scales[col, row / group], each
// product in float32 (dequantize_linear's values, bit for bit). Zero points are as the layout
// defines them (GPTQ's stored-minus-one added back, so 1..16 there, 0..15 for AWQ).
struct Int4Linear {
  int64_t n = 0;
  int64_t k = 0;
  int64_t group = 0;           // input rows per group (k when the config says -1)
  std::vector<uint8_t> codes;  // [n, k], 0..15
  std::vector<uint8_t> zeros;  // [n, k / group]
  std::vector<float> scales;   // [n, k / group], the stored scales as float32
};

// Unpacks `module` (AWQ, or 4-bit GPTQ) into Int4Linear. kUnsupported for other layouts and for
// act-order, whose groups are not runs of consecutive input rows.
Result<Int4Linear> unpack_int4_linear(const QuantConfig& config, const std::string& module,
                                      int64_t n, int64_t k, const TensorLookup& lookup);

// An FP8 module as backends that keep it 8-bit take it: the e4m3 codes as stored ([n, k], the
// checkpoint's tensor) and the weight scale of each output column as float32 (a per-tensor scale
// repeated), so that W[col, row] = e4m3(codes[col, row]) * scales[col].
struct Fp8Linear {
  int64_t n = 0;
  int64_t k = 0;
  TensorView codes;
  std::vector<float> scales;  // [n]
};

// `module` of an FP8 checkpoint as Fp8Linear; kUnsupported for other layouts.
Result<Fp8Linear> fp8_linear_parts(const QuantConfig& config, const std::string& module, int64_t n,
                                   int64_t k, const TensorLookup& lookup);

// AutoAWQ's GEMM packing puts output column 8w + j of a row in nibble kAwqNibbleOf[j] of packed
// word w (the packer's order is 0, 2, 4, 6, 1, 3, 5, 7: nibble i holds column kAwqOrder[i]).
inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
inline constexpr int kAwqNibbleOf[8] = {0, 4, 1, 5, 2, 6, 3, 7};

}  // namespace litellama
