#include "services/worker/quantized_linear.h"

#include <atomic>

#include <fmt/format.h>

namespace litellama {

namespace {

const std::vector<DType> kScaleDtypes = {DType::kF32, DType::kBF16, DType::kF16};

Status layout_error(const std::string& module, const QuantConfig& config, const std::string& what) {
  return make_error(StatusCode::kInvalidArgument, "{}: {} layout needs {}", module,
                    quant_method_name(config.method), what);
}

const int32_t* words(const TensorView& t) {
  return static_cast<const int32_t*>(t.data);
}

}  // namespace

Result<std::vector<QuantTensorSpec>> quantized_linear_specs(const QuantConfig& config,
                                                            const std::string& module, int64_t n,
                                                            int64_t k) {
  std::vector<QuantTensorSpec> specs;
  const std::string p = module + ".";
  switch (config.method) {
    case QuantMethod::kNone:
      specs.push_back({p + "weight", {{n, k}}, kScaleDtypes, false});
      return specs;
    case QuantMethod::kAwq: {
      const int64_t g = config.group_rows(k);
      if (n % 8 != 0)
        return layout_error(module, config, fmt::format("out_features {} % 8 == 0", n));
      if (k % g != 0) {
        return layout_error(module, config,
                            fmt::format("in_features {} divisible by group_size {}", k, g));
      }
      specs.push_back({p + "qweight", {{k, n / 8}}, {DType::kI32}, false});
      specs.push_back({p + "qzeros", {{k / g, n / 8}}, {DType::kI32}, false});
      specs.push_back({p + "scales", {{k / g, n}}, kScaleDtypes, false});
      return specs;
    }
    case QuantMethod::kGptq: {
      const int64_t per_word = 32 / config.bits, g = config.group_rows(k);
      if (k % per_word != 0 || n % per_word != 0) {
        return layout_error(
            module, config,
            fmt::format("in_features {} and out_features {} divisible by {}", k, n, per_word));
      }
      if (k % g != 0) {
        return layout_error(module, config,
                            fmt::format("in_features {} divisible by group_size {}", k, g));
      }
      specs.push_back({p + "qweight", {{k / per_word, n}}, {DType::kI32}, false});
      specs.push_back({p + "qzeros", {{k / g, n / per_word}}, {DType::kI32}, false});
      specs.push_back({p + "scales", {{k / g, n}}, kScaleDtypes, false});
      // Without act-order g_idx is row / group_size and some writers leave it out.
      specs.push_back({p + "g_idx", {{k}}, {DType::kI32}, !config.act_order});
      return specs;
    }
    case QuantMethod::kFp8:
    case QuantMethod::kInt8: {
      const DType w = config.method == QuantMethod::kFp8 ? DType::kF8E4M3 : DType::kI8;
      specs.push_back({p + "weight", {{n, k}}, {w}, false});
      if (config.weight_scale == ScaleStrategy::kTensor) {
        specs.push_back({p + "weight_scale", {{1}, {}}, kScaleDtypes, false});
      } else {
        specs.push_back({p + "weight_scale", {{n, 1}, {n}}, kScaleDtypes, false});
      }
      if (config.activations_quantized && !config.input_dynamic) {
        specs.push_back({p + "input_scale", {{1}, {}}, kScaleDtypes, false});
      }
      return specs;
    }
  }
  return make_error(StatusCode::kInternal, "unknown quantization method");
}

namespace {

// Calls visit(col, row, q, z, group) for every weight of an AWQ or GPTQ module: its integer code
// q, its zero point z (as the layout defines it: GPTQ's stored-minus-one already added back) and
// the group whose scale it takes (g_idx for GPTQ). *scales holds the scales [groups, n] as float32
// before the first call. Input rows are visited in parallel (OpenMP): calls for different rows
// must not write the same memory.
template <typename Visit>
Status visit_integer_codes(const QuantConfig& config, const std::string& module, int64_t n,
                           int64_t k, const TensorLookup& lookup, std::vector<float>* scales,
                           const Visit& visit) {
  const std::string p = module + ".";
  LITELLAMA_ASSIGN_OR_RETURN(TensorView qweight, lookup(p + "qweight"));
  LITELLAMA_ASSIGN_OR_RETURN(TensorView qzeros, lookup(p + "qzeros"));
  LITELLAMA_ASSIGN_OR_RETURN(TensorView scales_t, lookup(p + "scales"));
  *scales = scales_t.to_f32();
  const int32_t* qw = words(qweight);
  const int32_t* qz = words(qzeros);
  const int64_t g = config.group_rows(k);
  if (config.method == QuantMethod::kAwq) {
    const int64_t wpr = n / 8;  // packed words per row
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < k; ++row) {
      const int64_t group = row / g;
      for (int64_t col = 0; col < n; ++col) {
        const int shift = 4 * kAwqNibbleOf[col % 8];
        const auto word = static_cast<uint32_t>(qw[row * wpr + col / 8]);
        const auto zword = static_cast<uint32_t>(qz[group * wpr + col / 8]);
        visit(col, row, static_cast<int32_t>((word >> shift) & 0xfu),
              static_cast<int32_t>((zword >> shift) & 0xfu), group);
      }
    }
    return Status::ok();
  }
  const int bits = config.bits;
  const int64_t per_word = 32 / bits, groups = k / g;
  const uint32_t mask = (1u << bits) - 1u;
  std::vector<int32_t> g_idx(static_cast<size_t>(k));
  auto gi = lookup(p + "g_idx");
  for (int64_t row = 0; row < k; ++row) {
    g_idx[static_cast<size_t>(row)] =
        gi.is_ok() ? words(gi.value())[row] : static_cast<int32_t>(row / g);
    if (g_idx[static_cast<size_t>(row)] < 0 || g_idx[static_cast<size_t>(row)] >= groups) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}g_idx[{}] is {}, outside the {} groups of scales", p, row,
                        g_idx[static_cast<size_t>(row)], groups);
    }
  }
  const int32_t zero_offset = config.zeros_minus_one ? 1 : 0;
  const int64_t zwords = n / per_word;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < k; ++row) {
    const int64_t group = g_idx[static_cast<size_t>(row)];
    const int wshift = static_cast<int>((row % per_word) * bits);
    for (int64_t col = 0; col < n; ++col) {
      const auto word = static_cast<uint32_t>(qw[(row / per_word) * n + col]);
      const auto zword = static_cast<uint32_t>(qz[group * zwords + col / per_word]);
      const int zshift = static_cast<int>((col % per_word) * bits);
      visit(col, row, static_cast<int32_t>((word >> wshift) & mask),
            static_cast<int32_t>((zword >> zshift) & mask) + zero_offset, group);
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<float>> dequantize_linear(const QuantConfig& config, const std::string& module,
                                             int64_t n, int64_t k, const TensorLookup& lookup) {
  const std::string p = module + ".";
  std::vector<float> w(static_cast<size_t>(n * k));
  switch (config.method) {
    case QuantMethod::kNone: {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView t, lookup(p + "weight"));
      return t.to_f32();
    }
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      std::vector<float> scales;
      LITELLAMA_RETURN_IF_ERROR(visit_integer_codes(
          config, module, n, k, lookup, &scales,
          [&](int64_t col, int64_t row, int32_t q, int32_t z, int64_t group) {
            w[static_cast<size_t>(col * k + row)] =
                static_cast<float>(q - z) * scales[static_cast<size_t>(group * n + col)];
          }));
      return w;
    }
    case QuantMethod::kFp8:
    case QuantMethod::kInt8: {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView weight, lookup(p + "weight"));
      LITELLAMA_ASSIGN_OR_RETURN(TensorView scale_t, lookup(p + "weight_scale"));
      const std::vector<float> scale = scale_t.to_f32();
      const std::vector<float> q = weight.to_f32();  // exact: every e4m3 and int8 value is a float
      const bool per_row = config.weight_scale == ScaleStrategy::kChannel;
      for (int64_t row = 0; row < n; ++row) {
        const float s = scale[static_cast<size_t>(per_row ? row : 0)];
        for (int64_t col = 0; col < k; ++col) {
          w[static_cast<size_t>(row * k + col)] = q[static_cast<size_t>(row * k + col)] * s;
        }
      }
      return w;
    }
  }
  return make_error(StatusCode::kInternal, "unknown quantization method");
}

Result<Int4Linear> unpack_int4_linear(const QuantConfig& config, const std::string& module,
                                      int64_t n, int64_t k, const TensorLookup& lookup) {
  const bool int4 = config.method == QuantMethod::kAwq ||
                    (config.method == QuantMethod::kGptq && config.bits == 4);
  if (!int4) {
    return make_error(StatusCode::kUnsupported, "{}: {} {}-bit is not a 4-bit AWQ or GPTQ layout",
                      module, quant_method_name(config.method), config.bits);
  }
  Int4Linear out;
  out.n = n;
  out.k = k;
  out.group = config.group_rows(k);
  const int64_t groups = k / out.group;
  out.codes.resize(static_cast<size_t>(n * k));
  out.zeros.resize(static_cast<size_t>(n * groups));
  std::atomic<bool> contiguous = true;
  std::vector<float> scales;
  LITELLAMA_RETURN_IF_ERROR(visit_integer_codes(
      config, module, n, k, lookup, &scales,
      [&](int64_t col, int64_t row, int32_t q, int32_t z, int64_t group) {
        if (group != row / out.group) contiguous.store(false, std::memory_order_relaxed);
        out.codes[static_cast<size_t>(col * k + row)] = static_cast<uint8_t>(q);
        // Each group's first row writes its zero point (rows are visited in parallel).
        if (row % out.group == 0) {
          out.zeros[static_cast<size_t>(col * groups + row / out.group)] = static_cast<uint8_t>(z);
        }
      }));
  if (!contiguous.load()) {
    return make_error(StatusCode::kUnsupported,
                      "{}: act-order (g_idx other than row / group_size) is not supported here",
                      module);
  }
  out.scales.resize(static_cast<size_t>(n * groups));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t col = 0; col < n; ++col) {
      out.scales[static_cast<size_t>(col * groups + g)] = scales[static_cast<size_t>(g * n + col)];
    }
  }
  return out;
}

Result<Fp8Linear> fp8_linear_parts(const QuantConfig& config, const std::string& module, int64_t n,
                                   int64_t k, const TensorLookup& lookup) {
  if (config.method != QuantMethod::kFp8) {
    return make_error(StatusCode::kUnsupported, "{}: {} is not an FP8 layout", module,
                      quant_method_name(config.method));
  }
  Fp8Linear out;
  out.n = n;
  out.k = k;
  LITELLAMA_ASSIGN_OR_RETURN(out.codes, lookup(module + ".weight"));
  LITELLAMA_ASSIGN_OR_RETURN(TensorView scale_t, lookup(module + ".weight_scale"));
  if (out.codes.dtype != DType::kF8E4M3 || out.codes.shape != std::vector<int64_t>{n, k}) {
    return make_error(StatusCode::kInvalidArgument, "{}.weight: expected float8_e4m3fn [{}, {}]",
                      module, n, k);
  }
  const std::vector<float> scale = scale_t.to_f32();
  const bool per_row = config.weight_scale == ScaleStrategy::kChannel;
  if (scale.size() != static_cast<size_t>(per_row ? n : 1)) {
    return make_error(StatusCode::kInvalidArgument, "{}.weight_scale: {} values for {} columns",
                      module, scale.size(), n);
  }
  out.scales.resize(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) out.scales[static_cast<size_t>(c)] = scale[per_row ? c : 0];
  return out;
}

}  // namespace litellama
