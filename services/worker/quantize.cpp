#include "services/worker/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "services/worker/calibration.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cpu_model_runner.h"
#include "services/worker/offline_engine.h"
#include "services/worker/quantized_linear.h"
#include "services/worker/safetensors.h"

namespace litellama {

namespace fs = std::filesystem;
using nlohmann::json;

Result<QuantizeMethod> quantize_method_from_name(const std::string& name) {
  if (name == "gptq-rtn") return QuantizeMethod::kGptqRtn;
  if (name == "fp8") return QuantizeMethod::kFp8;
  if (name == "awq") return QuantizeMethod::kAwq;
  if (name == "w8a8") return QuantizeMethod::kW8a8;
  return make_error(StatusCode::kInvalidArgument,
                    "unknown quantization method '{}' (gptq-rtn, fp8, awq or w8a8)", name);
}

namespace {

// Shards of at most this many bytes, as Hugging Face writers split large checkpoints.
constexpr size_t kShardBytes = size_t{2} << 30;
// Rows of each projection input kept for AWQ's output-error search.
constexpr int64_t kSampleRows = 128;

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// GPTQ's quantizer on one group of one column, without error feedback: the range of the values
// widened to hold 0, 2^bits - 1 steps over it, a zero point rounding -min onto the grid.
struct RtnGroup {
  float scale = 1.0f;  // as stored (fp16), read back as float32
  int32_t zero = 0;
};

RtnGroup rtn_group(const float* column, int64_t stride, int64_t rows, int32_t max_q) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    lo = std::min(lo, column[r * stride]);
    hi = std::max(hi, column[r * stride]);
  }
  if (lo == 0.0f && hi == 0.0f) {
    lo = -1.0f;
    hi = 1.0f;
  }
  auto grid = [&](int32_t steps) {
    RtnGroup g;
    const float scale =
        std::clamp((hi - lo) / static_cast<float>(steps), std::ldexp(1.0f, -24), 65504.0f);
    g.scale = f16_to_f32(f32_to_f16(scale));
    g.zero = std::clamp(static_cast<int32_t>(std::nearbyint(-lo / g.scale)), 0, max_q);
    return g;
  };
  RtnGroup g = grid(max_q);
  if (g.zero == 0) {
    // The original GPTQ format stores zero points minus one: 0 would be written as 2^bits - 1
    // and read back as 2^bits by every reader. Such a group (its minimum within half a step of
    // 0) takes zero point 1 and one step fewer over the same range instead.
    g = grid(max_q - 1);
    g.zero = std::max(g.zero, 1);
  }
  return g;
}

// gptq-rtn of one projection w [n, k]: qweight, qzeros, scales, g_idx.
Result<std::vector<SafetensorsTensor>> gptq_rtn(const std::string& module,
                                                const std::vector<float>& w, int64_t n, int64_t k,
                                                int32_t group_size, double* max_error) {
  constexpr int kBits = 4, kPerWord = 8, kMaxQ = 15;
  const int64_t g = group_size <= 0 ? k : group_size;
  if (n % kPerWord != 0 || k % kPerWord != 0 || k % g != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: [{}, {}] does not fit 4-bit GPTQ packing with group size {} (both "
                      "dimensions multiples of 8, in_features a multiple of the group size; see "
                      "--group-size)",
                      module, n, k, g);
  }
  const int64_t groups = k / g;
  std::vector<int32_t> qweight(static_cast<size_t>(k / kPerWord * n), 0);
  std::vector<int32_t> qzeros(static_cast<size_t>(groups * (n / kPerWord)), 0);
  std::vector<uint16_t> scales(static_cast<size_t>(groups * n));
  std::vector<int32_t> g_idx(static_cast<size_t>(k));
  for (int64_t row = 0; row < k; ++row)
    g_idx[static_cast<size_t>(row)] = static_cast<int32_t>(row / g);
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t col = 0; col < n; ++col) {
      // Column `col` of the GPTQ [in, out] view is row `col` of the Linear weight.
      const float* values = w.data() + col * k + gi * g;
      const RtnGroup grp = rtn_group(values, 1, g, kMaxQ);
      scales[static_cast<size_t>(gi * n + col)] = f32_to_f16(grp.scale);
      const auto stored_zero = static_cast<uint32_t>((grp.zero - 1) & kMaxQ);
      auto& zword = qzeros[static_cast<size_t>(gi * (n / kPerWord) + col / kPerWord)];
      zword = static_cast<int32_t>(static_cast<uint32_t>(zword) |
                                   (stored_zero << (kBits * (col % kPerWord))));
      for (int64_t r = 0; r < g; ++r) {
        const int64_t row = gi * g + r;
        const int32_t q = std::clamp(
            static_cast<int32_t>(std::nearbyint(values[r] / grp.scale)) + grp.zero, 0, kMaxQ);
        *max_error =
            std::max(*max_error,
                     std::fabs(static_cast<double>(static_cast<float>(q - grp.zero) * grp.scale) -
                               values[r]));
        auto& word = qweight[static_cast<size_t>((row / kPerWord) * n + col)];
        word = static_cast<int32_t>(static_cast<uint32_t>(word) |
                                    (static_cast<uint32_t>(q) << (kBits * (row % kPerWord))));
      }
    }
  }
  std::vector<SafetensorsTensor> out;
  out.push_back({module + ".qweight", DType::kI32, {k / kPerWord, n}, bytes_of(qweight)});
  out.push_back({module + ".qzeros", DType::kI32, {groups, n / kPerWord}, bytes_of(qzeros)});
  out.push_back({module + ".scales", DType::kF16, {groups, n}, bytes_of(scales)});
  out.push_back({module + ".g_idx", DType::kI32, {k}, bytes_of(g_idx)});
  return out;
}

// One byte per weight with one float32 scale per output channel (the channel's largest |w| over
// `top`), the codec's `encode` of w / scale stored as `dtype`, `decode` giving back what a reader
// multiplies by the scale.
//   fp8:  e4m3 codes, top 448 (the largest finite e4m3).
//   int8: symmetric codes in [-128, 127], top 127.5: compressed-tensors' symmetric parameters
//         (largest |w| over half the 255 steps, zero point 0).
template <typename Encode, typename Decode>
std::vector<SafetensorsTensor> per_channel_bytes(const std::string& module,
                                                 const std::vector<float>& w, int64_t n, int64_t k,
                                                 DType dtype, float top, Encode encode,
                                                 Decode decode, double* max_error) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t row = 0; row < n; ++row) {
    const float* v = w.data() + row * k;
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(v[c]));
    const float scale = amax > 0.0f ? amax / top : 1.0f;
    scales[static_cast<size_t>(row)] = scale;
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t code = encode(v[c] / scale);
      codes[static_cast<size_t>(row * k + c)] = code;
      *max_error =
          std::max(*max_error, std::fabs(static_cast<double>(decode(code) * scale) - v[c]));
    }
  }
  std::vector<SafetensorsTensor> out;
  out.push_back({module + ".weight", dtype, {n, k}, std::move(codes)});
  out.push_back({module + ".weight_scale", DType::kF32, {n, 1}, bytes_of(scales)});
  return out;
}

std::vector<SafetensorsTensor> fp8_channel(const std::string& module, const std::vector<float>& w,
                                           int64_t n, int64_t k, double* max_error) {
  return per_channel_bytes(module, w, n, k, DType::kF8E4M3, 448.0f, f32_to_fp8e4m3, fp8e4m3_to_f32,
                           max_error);
}

std::vector<SafetensorsTensor> int8_channel(const std::string& module, const std::vector<float>& w,
                                            int64_t n, int64_t k, double* max_error) {
  return per_channel_bytes(
      module, w, n, k, DType::kI8, 127.5f,
      [](float x) {
        const auto q = std::clamp(static_cast<int32_t>(std::nearbyint(x)), -128, 127);
        return static_cast<uint8_t>(static_cast<int8_t>(q));
      },
      [](uint8_t code) { return static_cast<float>(static_cast<int8_t>(code)); }, max_error);
}

// AutoAWQ's quantizer on row-major w [n, k] in groups of g input columns: each group's own min
// and max (not widened to 0), 15 steps between them, an integer zero point. Fills the codes and
// the fp16-rounded scales and zeros ([k/g, n]) when given, and returns the dequantized weight.
std::vector<float> awq_quantize(const std::vector<float>& w, int64_t n, int64_t k, int64_t g,
                                std::vector<uint8_t>* codes = nullptr,
                                std::vector<uint16_t>* scales = nullptr,
                                std::vector<uint8_t>* zeros = nullptr) {
  constexpr int32_t kMaxQ = 15;
  std::vector<float> dq(w.size());
  for (int64_t o = 0; o < n; ++o) {
    for (int64_t gi = 0; gi < k / g; ++gi) {
      const float* v = w.data() + o * k + gi * g;
      float lo = v[0], hi = v[0];
      for (int64_t j = 1; j < g; ++j) {
        lo = std::min(lo, v[j]);
        hi = std::max(hi, v[j]);
      }
      const float scale =
          f16_to_f32(f32_to_f16(std::clamp((hi - lo) / kMaxQ, 1e-5f / kMaxQ, 65504.0f)));
      const int32_t zero = std::clamp(static_cast<int32_t>(-std::nearbyint(lo / scale)), 0, kMaxQ);
      if (scales) (*scales)[static_cast<size_t>(gi * n + o)] = f32_to_f16(scale);
      if (zeros) (*zeros)[static_cast<size_t>(gi * n + o)] = static_cast<uint8_t>(zero);
      for (int64_t j = 0; j < g; ++j) {
        const int32_t q =
            std::clamp(static_cast<int32_t>(std::nearbyint(v[j] / scale)) + zero, 0, kMaxQ);
        if (codes) (*codes)[static_cast<size_t>(o * k + gi * g + j)] = static_cast<uint8_t>(q);
        dq[static_cast<size_t>(o * k + gi * g + j)] = static_cast<float>(q - zero) * scale;
      }
    }
  }
  return dq;
}

// AWQ's GEMM layout of one projection: codes [n, k] and zeros [k/g, n] packed eight outputs per
// int32 in AutoAWQ's nibble order (quantized_linear.h's kAwqOrder).
Result<std::vector<SafetensorsTensor>> awq_pack(const std::string& module,
                                                const std::vector<float>& w, int64_t n, int64_t k,
                                                int32_t group_size, double* max_error) {
  const int64_t g = group_size <= 0 ? k : group_size;
  if (n % 8 != 0 || k % g != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: [{}, {}] does not fit AWQ packing with group size {} (out_features a "
                      "multiple of 8, in_features a multiple of the group size; see --group-size)",
                      module, n, k, g);
  }
  const int64_t groups = k / g;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k)), zeros(static_cast<size_t>(groups * n));
  std::vector<uint16_t> scales(static_cast<size_t>(groups * n));
  const std::vector<float> dq = awq_quantize(w, n, k, g, &codes, &scales, &zeros);
  for (size_t i = 0; i < dq.size(); ++i) {
    *max_error = std::max(*max_error, std::fabs(static_cast<double>(dq[i]) - w[i]));
  }
  std::vector<int32_t> qweight(static_cast<size_t>(k * (n / 8)), 0);
  std::vector<int32_t> qzeros(static_cast<size_t>(groups * (n / 8)), 0);
  for (int64_t word = 0; word < n / 8; ++word) {
    for (int nib = 0; nib < 8; ++nib) {
      const int64_t col = word * 8 + kAwqOrder[nib];
      for (int64_t row = 0; row < k; ++row) {
        auto& packed = qweight[static_cast<size_t>(row * (n / 8) + word)];
        packed = static_cast<int32_t>(
            static_cast<uint32_t>(packed) |
            (uint32_t{codes[static_cast<size_t>(col * k + row)]} << (4 * nib)));
      }
      for (int64_t gi = 0; gi < groups; ++gi) {
        auto& packed = qzeros[static_cast<size_t>(gi * (n / 8) + word)];
        packed =
            static_cast<int32_t>(static_cast<uint32_t>(packed) |
                                 (uint32_t{zeros[static_cast<size_t>(gi * n + col)]} << (4 * nib)));
      }
    }
  }
  std::vector<SafetensorsTensor> out;
  out.push_back({module + ".qweight", DType::kI32, {k, n / 8}, bytes_of(qweight)});
  out.push_back({module + ".qzeros", DType::kI32, {groups, n / 8}, bytes_of(qzeros)});
  out.push_back({module + ".scales", DType::kF16, {groups, n}, bytes_of(scales)});
  return out;
}

// Collects tensors into shards and writes them, with an index when there is more than one.
class ShardWriter {
 public:
  explicit ShardWriter(std::string dir) : dir_(std::move(dir)) {}

  Status add(SafetensorsTensor t) {
    if (!pending_.empty() && pending_bytes_ + t.data.size() > kShardBytes) {
      LITELLAMA_RETURN_IF_ERROR(flush());
    }
    pending_bytes_ += t.data.size();
    total_bytes_ += static_cast<int64_t>(t.data.size());
    pending_.push_back(std::move(t));
    return Status::ok();
  }

  Status finish() {
    LITELLAMA_RETURN_IF_ERROR(flush());
    const size_t n = shard_tensors_.size();
    if (n == 1) {
      fs::rename(part_path(0), fs::path(dir_) / "model.safetensors");
      return Status::ok();
    }
    json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", json::object()}};
    for (size_t i = 0; i < n; ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
      fs::rename(part_path(i), fs::path(dir_) / name);
      for (const std::string& t : shard_tensors_[i]) index["weight_map"][t] = name;
    }
    std::ofstream out(fs::path(dir_) / "model.safetensors.index.json");
    out << index.dump(2) << "\n";
    return out ? Status::ok()
               : make_error(StatusCode::kInternal, "cannot write the index in '{}'", dir_);
  }

  int64_t total_bytes() const { return total_bytes_; }

 private:
  std::string part_path(size_t i) const {
    return (fs::path(dir_) / fmt::format(".part-{:05d}.safetensors", i)).string();
  }

  Status flush() {
    if (pending_.empty()) return Status::ok();
    std::vector<std::string> names;
    for (const auto& t : pending_) names.push_back(t.name);
    LITELLAMA_RETURN_IF_ERROR(write_safetensors(part_path(shard_tensors_.size()), pending_));
    shard_tensors_.push_back(std::move(names));
    pending_.clear();
    pending_bytes_ = 0;
    return Status::ok();
  }

  std::string dir_;
  std::vector<SafetensorsTensor> pending_;
  size_t pending_bytes_ = 0;
  int64_t total_bytes_ = 0;
  std::vector<std::vector<std::string>> shard_tensors_;
};

}  // namespace

json quantization_config(const QuantizeOptions& options, const ModelConfig& model) {
  if (options.method == QuantizeMethod::kGptqRtn) {
    return {{"quant_method", "gptq"},
            {"bits", 4},
            {"group_size", options.group_size},
            {"sym", false},
            {"desc_act", false},
            {"static_groups", false},
            {"lm_head", false},
            {"checkpoint_format", "gptq"},
            {"damp_percent", 0.01},  // unused by round to nearest; readers require (0, 1)
            {"true_sequential", true}};
  }
  // Only the text model's layers are quantized: a LLaVA checkpoint's vision tower and projector
  // stay dense, and readers must be told.
  const json not_converted = model.arch == Architecture::kLlava
                                 ? json{"vision_tower", "multi_modal_projector"}
                                 : json(nullptr);
  if (options.method == QuantizeMethod::kAwq) {
    return {
        {"quant_method", "awq"}, {"bits", 4},         {"group_size", options.group_size},
        {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", not_converted}};
  }
  const char* type = options.method == QuantizeMethod::kW8a8 ? "int" : "float";
  json weights = {{"num_bits", 8},     {"type", type},     {"strategy", "channel"},
                  {"symmetric", true}, {"dynamic", false}, {"group_size", nullptr}};
  json inputs = {{"num_bits", 8},     {"type", type},    {"strategy", "token"},
                 {"symmetric", true}, {"dynamic", true}, {"group_size", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", options.method == QuantizeMethod::kW8a8 ? "int-quantized" : "float-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", inputs},
              {"output_activations", nullptr}}}}},
          {"ignore", {"lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*"}},
          {"kv_cache_scheme", nullptr}};
}

namespace {

// One decoder layer's projections and norms in float32, as the quantizer edits them.
struct LayerFloats {
  std::vector<float> q, k, v, o, gate, up, down, input_norm, post_norm;
};

// Divides a norm's weight (or the rows of the projection before) by s, so that its output is x / s.
void divide_rows(std::vector<float>* w, int64_t rows, int64_t cols, const std::vector<float>& s) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      (*w)[static_cast<size_t>(r * cols + c)] /= s[static_cast<size_t>(r)];
  }
}

// The calibration methods' scales for layer l, folded into its weights and norms.
void fold_scales(const Checkpoint& ckpt, const QuantizeOptions& options, const LayerStats& stats,
                 LayerFloats* f) {
  const ModelConfig& c = ckpt.config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size,
                q_dim = int64_t{c.n_heads} * c.head_dim,
                kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  const std::vector<DenseWeight> qkv = {{&f->q, q_dim, h}, {&f->k, kv_dim, h}, {&f->v, kv_dim, h}};
  const std::vector<DenseWeight> gate_up = {{&f->gate, inter, h}, {&f->up, inter, h}};
  const std::vector<DenseWeight> down = {{&f->down, h, inter}};
  const auto& in_qkv = stats[static_cast<size_t>(ProjectionInput::kQkv)];
  const auto& in_mlp = stats[static_cast<size_t>(ProjectionInput::kGateUp)];
  if (options.method == QuantizeMethod::kW8a8) {
    constexpr double kAlpha = 0.5;
    const auto s1 = smoothquant_scales(in_qkv, qkv, kAlpha);
    scale_columns(qkv, s1);
    divide_rows(&f->input_norm, h, 1, s1);
    const auto s2 = smoothquant_scales(in_mlp, gate_up, kAlpha);
    scale_columns(gate_up, s2);
    divide_rows(&f->post_norm, h, 1, s2);
    return;
  }
  const int64_t group = options.group_size;
  auto quantize = [group](const std::vector<float>& w, int64_t n, int64_t k) {
    return awq_quantize(w, n, k, group <= 0 ? k : group);
  };
  const auto s1 = awq_search_scales(in_qkv, qkv, group, quantize);
  scale_columns(qkv, s1);
  divide_rows(&f->input_norm, h, 1, s1);
  if (c.n_kv_heads == c.n_heads && !c.qkv_bias) {
    // Without grouped-query attention, attention output channel j is a mix of v_proj's output
    // channel j alone, so o_proj's scales fold into v_proj's rows (as AutoAWQ does then).
    const std::vector<DenseWeight> o = {{&f->o, h, q_dim}};
    const auto so =
        awq_search_scales(stats[static_cast<size_t>(ProjectionInput::kO)], o, group, quantize);
    scale_columns(o, so);
    divide_rows(&f->v, kv_dim, h, so);
  }
  const auto s2 = awq_search_scales(in_mlp, gate_up, group, quantize);
  scale_columns(gate_up, s2);
  divide_rows(&f->post_norm, h, 1, s2);
  const auto s3 =
      awq_search_scales(stats[static_cast<size_t>(ProjectionInput::kDown)], down, group, quantize);
  scale_columns(down, s3);
  divide_rows(&f->up, inter, h, s3);
}

Result<std::vector<SafetensorsTensor>> quantize_projection(const QuantizeOptions& options,
                                                           const std::string& module,
                                                           const std::vector<float>& w, int64_t n,
                                                           int64_t k, double* max_error) {
  switch (options.method) {
    case QuantizeMethod::kGptqRtn:
      return gptq_rtn(module, w, n, k, options.group_size, max_error);
    case QuantizeMethod::kAwq:
      return awq_pack(module, w, n, k, options.group_size, max_error);
    case QuantizeMethod::kFp8:
      return fp8_channel(module, w, n, k, max_error);
    case QuantizeMethod::kW8a8:
      return int8_channel(module, w, n, k, max_error);
  }
  return make_error(StatusCode::kInternal, "unknown quantization method");
}

// A float32 vector written back in `like`'s dtype and shape.
SafetensorsTensor as_stored(const TensorView& like, const std::vector<float>& values) {
  SafetensorsTensor t{like.name, like.dtype, like.shape,
                      std::vector<uint8_t>(values.size() * dtype_size_bytes(like.dtype))};
  convert_from_f32(t.data.data(), like.dtype, values.data(), values.size());
  return t;
}

}  // namespace

Result<QuantizeReport> quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                           const QuantizeOptions& options) {
  const bool calibrated =
      options.method == QuantizeMethod::kAwq || options.method == QuantizeMethod::kW8a8;
  if (calibrated && options.calibration_ids.empty()) {
    return make_error(StatusCode::kInvalidArgument,
                      "quantize: --method {} needs --calibration (a text to collect activation "
                      "statistics over)",
                      options.method == QuantizeMethod::kAwq ? "awq" : "w8a8");
  }
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(in_dir));
  const ModelConfig& c = ckpt.config();
  const LayerTensorNames layer0 = ckpt.layer_names(0);
  if (c.quant.method != QuantMethod::kNone) {
    return make_error(StatusCode::kInvalidArgument, "quantize: '{}' is already quantized ({})",
                      in_dir, quant_method_name(c.quant.method));
  }
  if (options.method == QuantizeMethod::kGptqRtn && c.arch == Architecture::kLlava) {
    return make_error(StatusCode::kUnsupported,
                      "quantize: gptq-rtn does not write LLaVA checkpoints (a GPTQ config has no "
                      "field every reader honours to keep the vision tower dense); use awq, fp8 "
                      "or w8a8");
  }
  std::error_code ec;
  if (fs::exists(fs::path(out_dir) / "config.json", ec)) {
    return make_error(StatusCode::kInvalidArgument, "quantize: '{}' already holds a checkpoint",
                      out_dir);
  }
  // Every projection must fit the layout before the (long) calibration starts.
  if (options.method == QuantizeMethod::kAwq || options.method == QuantizeMethod::kGptqRtn) {
    const int64_t per_word = 8;
    for (const std::string* p :
         {&layer0.q, &layer0.k, &layer0.v, &layer0.o, &layer0.gate, &layer0.up, &layer0.down}) {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(*p));
      const int64_t n = t.shape[0], k = t.shape[1];
      const int64_t g = options.group_size <= 0 ? k : options.group_size;
      const bool gptq = options.method == QuantizeMethod::kGptqRtn;
      if (n % per_word != 0 || (gptq && k % per_word != 0) || k % g != 0) {
        return make_error(StatusCode::kInvalidArgument,
                          "quantize: {} [{}, {}] does not fit 4-bit {} packing with group size {} "
                          "(out_features{} a multiple of 8, in_features a multiple of the group "
                          "size; see --group-size)",
                          *p, n, k, gptq ? "GPTQ" : "AWQ", g, gptq ? " and in_features" : "");
      }
    }
  }
  std::vector<LayerStats> stats;
  if (calibrated) {
    LITELLAMA_ASSIGN_OR_RETURN(stats, calibrate(ckpt, options.calibration_ids, kSampleRows));
  }
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(StatusCode::kInvalidArgument, "quantize: cannot create '{}'", out_dir);

  QuantizeReport report;
  ShardWriter writer(out_dir);
  std::set<std::string> written;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerTensorNames n = ckpt.layer_names(l);
    LayerFloats f;
    const std::vector<std::pair<const std::string*, std::vector<float>*>> projections = {
        {&n.q, &f.q},       {&n.k, &f.k},   {&n.v, &f.v},      {&n.o, &f.o},
        {&n.gate, &f.gate}, {&n.up, &f.up}, {&n.down, &f.down}};
    for (const auto& [name, dst] : projections) {
      LITELLAMA_ASSIGN_OR_RETURN(*dst, ckpt.linear_f32(*name));
    }
    LITELLAMA_ASSIGN_OR_RETURN(TensorView input_norm, ckpt.tensor(n.input_norm));
    LITELLAMA_ASSIGN_OR_RETURN(TensorView post_norm, ckpt.tensor(n.post_attention_norm));
    if (calibrated) {
      f.input_norm = input_norm.to_f32();
      f.post_norm = post_norm.to_f32();
      fold_scales(ckpt, options, stats[static_cast<size_t>(l)], &f);
      LITELLAMA_RETURN_IF_ERROR(writer.add(as_stored(input_norm, f.input_norm)));
      LITELLAMA_RETURN_IF_ERROR(writer.add(as_stored(post_norm, f.post_norm)));
      written.insert(n.input_norm);
      written.insert(n.post_attention_norm);
      report.bytes_in += static_cast<int64_t>(input_norm.size_bytes + post_norm.size_bytes);
    }
    for (const auto& [name, w] : projections) {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(*name));
      report.bytes_in += static_cast<int64_t>(t.size_bytes);
      const std::string module = name->substr(0, name->size() - std::string(".weight").size());
      LITELLAMA_ASSIGN_OR_RETURN(auto out, quantize_projection(options, module, *w, t.shape[0],
                                                               t.shape[1], &report.max_abs_error));
      for (auto& q : out) LITELLAMA_RETURN_IF_ERROR(writer.add(std::move(q)));
      written.insert(*name);
      ++report.modules;
    }
  }
  for (const std::string& name : ckpt.tensor_names()) {
    if (written.count(name)) continue;
    LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name));
    report.bytes_in += static_cast<int64_t>(t.size_bytes);
    const auto* p = static_cast<const uint8_t*>(t.data);
    LITELLAMA_RETURN_IF_ERROR(
        writer.add({name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.size_bytes)}));
  }
  LITELLAMA_RETURN_IF_ERROR(writer.finish());
  report.bytes_out = writer.total_bytes();

  LITELLAMA_ASSIGN_OR_RETURN(std::string config_text,
                             read_text_file((fs::path(in_dir) / "config.json").string()));
  json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  config["quantization_config"] = quantization_config(options, c);
  {
    std::ofstream out(fs::path(out_dir) / "config.json");
    out << config.dump(2) << "\n";
    if (!out) return make_error(StatusCode::kInternal, "cannot write '{}/config.json'", out_dir);
  }
  // Everything else that travels with a checkpoint: tokenizer, generation config, templates.
  for (const auto& entry : fs::directory_iterator(in_dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" ||
        file == "model.safetensors.index.json" || entry.path().extension() == ".safetensors") {
      continue;
    }
    fs::copy_file(entry.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(StatusCode::kInternal, "quantize: cannot copy '{}'", file);
  }
  // What was written must load: the same checks as serving it.
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint check, Checkpoint::open(out_dir));
  (void)check;
  return report;
}

}  // namespace litellama
