#include "services/worker/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "services/worker/checkpoint.h"
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
  RtnGroup g;
  const float scale =
      std::clamp((hi - lo) / static_cast<float>(max_q), std::ldexp(1.0f, -24), 65504.0f);
  g.scale = f16_to_f32(f32_to_f16(scale));
  g.zero = std::clamp(static_cast<int32_t>(std::nearbyint(-lo / g.scale)), 0, max_q);
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

// fp8 of one projection: e4m3 codes and a float32 scale per output channel.
std::vector<SafetensorsTensor> fp8_channel(const std::string& module, const std::vector<float>& w,
                                           int64_t n, int64_t k, double* max_error) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t row = 0; row < n; ++row) {
    const float* v = w.data() + row * k;
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(v[c]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    scales[static_cast<size_t>(row)] = scale;
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t code = f32_to_fp8e4m3(v[c] / scale);
      codes[static_cast<size_t>(row * k + c)] = code;
      *max_error =
          std::max(*max_error, std::fabs(static_cast<double>(fp8e4m3_to_f32(code) * scale) - v[c]));
    }
  }
  std::vector<SafetensorsTensor> out;
  out.push_back({module + ".weight", DType::kF8E4M3, {n, k}, std::move(codes)});
  out.push_back({module + ".weight_scale", DType::kF32, {n, 1}, bytes_of(scales)});
  return out;
}

json quantization_config(const QuantizeOptions& options) {
  if (options.method == QuantizeMethod::kGptqRtn) {
    return {{"quant_method", "gptq"},
            {"bits", 4},
            {"group_size", options.group_size},
            {"sym", false},
            {"desc_act", false},
            {"static_groups", false},
            {"lm_head", false},
            {"checkpoint_format", "gptq"},
            {"damp_percent", 0.0},
            {"true_sequential", true}};
  }
  json weights = {{"num_bits", 8},     {"type", "float"},  {"strategy", "channel"},
                  {"symmetric", true}, {"dynamic", false}, {"group_size", nullptr}};
  json inputs = {{"num_bits", 8},     {"type", "float"}, {"strategy", "token"},
                 {"symmetric", true}, {"dynamic", true}, {"group_size", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
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

Result<QuantizeReport> quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                           const QuantizeOptions& options) {
  if (options.method == QuantizeMethod::kAwq || options.method == QuantizeMethod::kW8a8) {
    return make_error(StatusCode::kUnsupported,
                      "quantize: --method {} needs activation statistics over the calibration "
                      "text, which this build does not collect yet (gptq-rtn and fp8 need none)",
                      options.method == QuantizeMethod::kAwq ? "awq" : "w8a8");
  }
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(in_dir));
  if (ckpt.config().quant.method != QuantMethod::kNone) {
    return make_error(StatusCode::kInvalidArgument, "quantize: '{}' is already quantized ({})",
                      in_dir, quant_method_name(ckpt.config().quant.method));
  }
  std::error_code ec;
  if (fs::exists(fs::path(out_dir) / "config.json", ec)) {
    return make_error(StatusCode::kInvalidArgument, "quantize: '{}' already holds a checkpoint",
                      out_dir);
  }
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(StatusCode::kInvalidArgument, "quantize: cannot create '{}'", out_dir);

  std::set<std::string> projections;
  for (int32_t l = 0; l < ckpt.config().n_layers; ++l) {
    const LayerTensorNames n = ckpt.layer_names(l);
    for (const std::string* p : {&n.q, &n.k, &n.v, &n.o, &n.gate, &n.up, &n.down}) {
      projections.insert(*p);
    }
  }
  QuantizeReport report;
  ShardWriter writer(out_dir);
  for (const std::string& name : ckpt.tensor_names()) {
    LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name));
    report.bytes_in += static_cast<int64_t>(t.size_bytes);
    if (projections.count(name) == 0) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      LITELLAMA_RETURN_IF_ERROR(
          writer.add({name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.size_bytes)}));
      continue;
    }
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    const int64_t n = t.shape[0], k = t.shape[1];
    const std::vector<float> w = t.to_f32();
    std::vector<SafetensorsTensor> out;
    if (options.method == QuantizeMethod::kGptqRtn) {
      LITELLAMA_ASSIGN_OR_RETURN(
          out, gptq_rtn(module, w, n, k, options.group_size, &report.max_abs_error));
    } else {
      out = fp8_channel(module, w, n, k, &report.max_abs_error);
    }
    for (auto& q : out) LITELLAMA_RETURN_IF_ERROR(writer.add(std::move(q)));
    ++report.modules;
  }
  LITELLAMA_RETURN_IF_ERROR(writer.finish());
  report.bytes_out = writer.total_bytes();

  LITELLAMA_ASSIGN_OR_RETURN(std::string config_text,
                             read_text_file((fs::path(in_dir) / "config.json").string()));
  json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  config["quantization_config"] = quantization_config(options);
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
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint written, Checkpoint::open(out_dir));
  (void)written;
  return report;
}

}  // namespace litellama
