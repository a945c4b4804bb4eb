#include "services/worker/cuda/cuda_weights.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "kernels/cuda_check.h"

namespace litellama {

namespace {

// One device tensor: the checkpoint tensors concatenated along their first dimension, in dtype.
struct Placement {
  std::vector<std::string> sources;
  // Non-empty: a vector whose element j multiplies column j of every source (an RMSNorm's weight
  // folded into the projection after it).
  std::string column_scale;
  int64_t ones = 0;  // no sources: this many float32 ones
  // 4-bit sources (kernels/linear_w4.h): codes, then zero points and scales at these offsets
  // from the placement's; n is the sum of the sources' out_features.
  bool w4 = false;
  // FP8 sources (kernels/linear_fp8.h): codes [n, k], then float32 scales [n] at scales_at.
  bool fp8 = false;
  int64_t n = 0, k = 0, group = 0;
  size_t zeros_at = 0, scales_at = 0;
  DType dtype = DType::kF32;
  size_t offset = 0;
  size_t size_bytes = 0;
};

class UploadPlan {
 public:
  explicit UploadPlan(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  // Returns the placement's index; its offset is known after every add.
  Result<size_t> add(std::vector<std::string> sources, DType dtype, std::string column_scale = {}) {
    Placement p;
    p.dtype = dtype;
    int64_t scale_size = 0;
    if (!column_scale.empty()) {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView scale, checkpoint_.tensor(column_scale));
      scale_size = scale.numel();
    }
    for (const std::string& name : sources) {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView t, checkpoint_.tensor(name));
      if (scale_size > 0 && (t.shape.size() != 2 || t.shape[1] != scale_size)) {
        return make_error(StatusCode::kInvalidArgument, "{}: {} columns, {} has {} elements", name,
                          t.shape.size() == 2 ? t.shape[1] : int64_t{-1}, column_scale, scale_size);
      }
      p.size_bytes += static_cast<size_t>(t.numel()) * dtype_size_bytes(dtype);
    }
    p.sources = std::move(sources);
    p.column_scale = std::move(column_scale);
    return place(std::move(p));
  }

  // The sources kept 4-bit, or nullopt when any of them is stored dense (then add() them).
  Result<std::optional<size_t>> add_w4(std::vector<std::string> sources, DType dtype) {
    Placement p;
    p.w4 = true;
    p.dtype = dtype;
    for (const std::string& name : sources) {
      if (!checkpoint_.is_quantized(name)) return std::optional<size_t>();
      LITELLAMA_ASSIGN_OR_RETURN(auto shape, checkpoint_.linear_shape(name));
      const int64_t group = checkpoint_.config().quant.group_rows(shape.second);
      if ((p.k != 0 && (p.k != shape.second || p.group != group)) ||
          !w4_layout_supports(shape.first, shape.second, group)) {
        return make_error(StatusCode::kUnsupported,
                          "{}: [{}, {}] in groups of {} does not fit the "
                          "4-bit device layout",
                          name, shape.first, shape.second, group);
      }
      p.n += shape.first;
      p.k = shape.second;
      p.group = group;
    }
    const auto groups = static_cast<size_t>(p.n * (p.k / p.group));
    p.zeros_at = align_up(static_cast<size_t>(p.n * p.k / 2), 256);
    p.scales_at = align_up(p.zeros_at + groups, 256);
    p.size_bytes = p.scales_at + groups * dtype_size_bytes(dtype);
    p.sources = std::move(sources);
    return std::optional<size_t>(place(std::move(p)));
  }

  // The sources kept FP8, or nullopt when any of them is stored dense (then add() them).
  Result<std::optional<size_t>> add_fp8(std::vector<std::string> sources) {
    Placement p;
    p.fp8 = true;
    for (const std::string& name : sources) {
      if (!checkpoint_.is_quantized(name)) return std::optional<size_t>();
      LITELLAMA_ASSIGN_OR_RETURN(auto shape, checkpoint_.linear_shape(name));
      if ((p.k != 0 && p.k != shape.second) || shape.second % 16 != 0) {
        return make_error(StatusCode::kUnsupported,
                          "{}: [{}, {}] does not fit the FP8 device layout (in_features a "
                          "multiple of 16, one for all fused modules)",
                          name, shape.first, shape.second);
      }
      p.n += shape.first;
      p.k = shape.second;
    }
    p.scales_at = align_up(static_cast<size_t>(p.n * p.k), 256);
    p.size_bytes = p.scales_at + static_cast<size_t>(p.n) * sizeof(float);
    p.sources = std::move(sources);
    return std::optional<size_t>(place(std::move(p)));
  }

  Fp8Weight fp8_weight(const DeviceBuffer& storage, size_t index) const {
    const Placement& p = placements_[index];
    Fp8Weight w;
    w.codes = storage.as<const uint8_t>(p.offset);
    w.scales = storage.as<const float>(p.offset + p.scales_at);
    w.n = static_cast<int32_t>(p.n);
    w.k = static_cast<int32_t>(p.k);
    return w;
  }

  W4Weight w4_weight(const DeviceBuffer& storage, size_t index) const {
    const Placement& p = placements_[index];
    W4Weight w;
    w.codes = storage.as<const uint32_t>(p.offset);
    w.zeros = storage.as<const uint8_t>(p.offset + p.zeros_at);
    w.scales = storage.as<const char>(p.offset + p.scales_at);
    w.n = static_cast<int32_t>(p.n);
    w.k = static_cast<int32_t>(p.k);
    w.group = static_cast<int32_t>(p.group);
    return w;
  }

  size_t add_ones(int64_t n) {
    Placement p;
    p.ones = n;
    p.size_bytes = static_cast<size_t>(n) * sizeof(float);
    return place(std::move(p));
  }

  size_t total_bytes() const { return total_bytes_; }
  size_t offset(size_t index) const { return placements_[index].offset; }

  Status upload(const DeviceBuffer& storage) const {
    std::vector<uint8_t> host;
    std::vector<float> f32;
    std::vector<float> scale;
    for (const Placement& p : placements_) {
      size_t at = p.offset;
      if (p.w4) {
        LITELLAMA_RETURN_IF_ERROR(upload_w4(p, storage));
        continue;
      }
      if (p.fp8) {
        LITELLAMA_RETURN_IF_ERROR(upload_fp8(p, storage));
        continue;
      }
      if (p.ones > 0) {
        const std::vector<float> ones(static_cast<size_t>(p.ones), 1.0f);
        LITELLAMA_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(storage.as<char>(at), ones.data(), p.size_bytes, cudaMemcpyHostToDevice));
        continue;
      }
      if (!p.column_scale.empty()) {
        LITELLAMA_ASSIGN_OR_RETURN(TensorView t, checkpoint_.tensor(p.column_scale));
        scale = t.to_f32();
      }
      for (const std::string& name : p.sources) {
        LITELLAMA_ASSIGN_OR_RETURN(TensorView t, checkpoint_.tensor(name));
        const auto n = static_cast<size_t>(t.numel());
        const size_t bytes = n * dtype_size_bytes(p.dtype);
        const void* src = t.data;
        if (!p.column_scale.empty()) {
          f32 = t.to_f32();
          // Rows of scale.size() columns (checked by add); each product rounded once, to dtype.
          for (size_t i = 0; i < n; ++i) f32[i] *= scale[i % scale.size()];
          host.resize(bytes);
          convert_from_f32(host.data(), p.dtype, f32.data(), n);
          src = host.data();
        } else if (t.dtype != p.dtype) {
          f32 = t.to_f32();
          host.resize(bytes);
          convert_from_f32(host.data(), p.dtype, f32.data(), n);
          src = host.data();
        }
        LITELLAMA_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(storage.as<char>(at), src, bytes, cudaMemcpyHostToDevice));
        at += bytes;
      }
    }
    return Status::ok();
  }

 private:
  // One source at a time: its codes as stored, its scales per column.
  Status upload_fp8(const Placement& p, const DeviceBuffer& storage) const {
    int64_t col = 0;
    for (const std::string& name : p.sources) {
      LITELLAMA_ASSIGN_OR_RETURN(const Fp8Linear q, checkpoint_.fp8_linear(name));
      LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(storage.as<char>(p.offset) + col * p.k,
                                                q.codes.data, static_cast<size_t>(q.n * q.k),
                                                cudaMemcpyHostToDevice));
      LITELLAMA_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(storage.as<char>(p.offset + p.scales_at) + col * sizeof(float),
                     q.scales.data(), q.scales.size() * sizeof(float), cudaMemcpyHostToDevice));
      col += q.n;
    }
    return Status::ok();
  }

  // One source at a time: unpacked on the host, packed into the device layout, copied to its
  // columns of each of the three arrays.
  Status upload_w4(const Placement& p, const DeviceBuffer& storage) const {
    int64_t col = 0;
    const int64_t groups = p.k / p.group;
    std::vector<uint32_t> words;
    std::vector<uint8_t> scales;
    for (const std::string& name : p.sources) {
      LITELLAMA_ASSIGN_OR_RETURN(const Int4Linear q, checkpoint_.int4_linear(name));
      words.resize(static_cast<size_t>(q.n * q.k / 8));
      pack_w4_codes(q.codes.data(), q.n, q.k, words.data());
      scales.resize(q.scales.size() * dtype_size_bytes(p.dtype));
      convert_from_f32(scales.data(), p.dtype, q.scales.data(), q.scales.size());
      LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(storage.as<char>(p.offset) + col * p.k / 2,
                                                words.data(), words.size() * sizeof(uint32_t),
                                                cudaMemcpyHostToDevice));
      LITELLAMA_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(storage.as<char>(p.offset + p.zeros_at) + col * groups, q.zeros.data(),
                     q.zeros.size(), cudaMemcpyHostToDevice));
      LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(
          storage.as<char>(p.offset + p.scales_at) + col * groups * dtype_size_bytes(p.dtype),
          scales.data(), scales.size(), cudaMemcpyHostToDevice));
      col += q.n;
    }
    return Status::ok();
  }

  size_t place(Placement p) {
    p.offset = total_bytes_;
    total_bytes_ = align_up(total_bytes_ + p.size_bytes, 256);
    placements_.push_back(std::move(p));
    return placements_.size() - 1;
  }

  const Checkpoint& checkpoint_;
  std::vector<Placement> placements_;
  size_t total_bytes_ = 0;
};

}  // namespace

Result<CudaWeights> CudaWeights::upload(const Checkpoint& checkpoint, DType compute_dtype,
                                        bool fold_input_norms) {
  const ModelConfig& c = checkpoint.config();
  UploadPlan plan(checkpoint);
  struct LayerIndex {
    size_t input_norm, qkv, qkv_bias, q_norm, k_norm, o, post_norm, gate_up, down;
    // The projections kept 4-bit or FP8 (as the checkpoint's method says): their placements
    // (qkv, o, gate_up, down are then unused).
    std::optional<size_t> qkv_q, o_q, gate_up_q, down_q;
  };
  const bool fp8 = c.quant.method == QuantMethod::kFp8;
  // A fused projection: 4-bit or FP8 when all its modules are stored so, else dense in
  // compute_dtype.
  auto add_projection = [&](std::vector<std::string> sources, const std::string& column_scale,
                            size_t* dense, std::optional<size_t>* quantized) -> Status {
    if (fp8) {
      LITELLAMA_ASSIGN_OR_RETURN(*quantized, plan.add_fp8(sources));
    } else {
      LITELLAMA_ASSIGN_OR_RETURN(*quantized, plan.add_w4(sources, compute_dtype));
    }
    if (quantized->has_value()) return Status::ok();
    LITELLAMA_ASSIGN_OR_RETURN(*dense, plan.add(std::move(sources), compute_dtype, column_scale));
    return Status::ok();
  };
  std::vector<LayerIndex> index(static_cast<size_t>(c.n_layers));
  LITELLAMA_ASSIGN_OR_RETURN(const size_t embed,
                             plan.add({checkpoint.embed_name()}, compute_dtype));
  LITELLAMA_ASSIGN_OR_RETURN(const size_t final_norm,
                             plan.add({checkpoint.final_norm_name()}, DType::kF32));
  size_t lm_head = embed;
  if (!c.tie_word_embeddings) {
    LITELLAMA_ASSIGN_OR_RETURN(lm_head, plan.add({checkpoint.lm_head_name()}, compute_dtype));
  }
  const size_t ones = fold_input_norms ? plan.add_ones(c.hidden_size) : 0;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerTensorNames n = checkpoint.layer_names(l);
    LayerIndex& li = index[static_cast<size_t>(l)];
    const std::string input_scale = fold_input_norms ? n.input_norm : std::string();
    if (fold_input_norms) {
      li.input_norm = ones;
    } else {
      LITELLAMA_ASSIGN_OR_RETURN(li.input_norm, plan.add({n.input_norm}, DType::kF32));
    }
    LITELLAMA_RETURN_IF_ERROR(add_projection({n.q, n.k, n.v}, input_scale, &li.qkv, &li.qkv_q));
    if (c.qkv_bias) {
      LITELLAMA_ASSIGN_OR_RETURN(li.qkv_bias,
                                 plan.add({n.q_bias, n.k_bias, n.v_bias}, DType::kF32));
    }
    if (c.qk_norm) {
      LITELLAMA_ASSIGN_OR_RETURN(li.q_norm, plan.add({n.q_norm}, DType::kF32));
      LITELLAMA_ASSIGN_OR_RETURN(li.k_norm, plan.add({n.k_norm}, DType::kF32));
    }
    LITELLAMA_RETURN_IF_ERROR(add_projection({n.o}, {}, &li.o, &li.o_q));
    LITELLAMA_ASSIGN_OR_RETURN(li.post_norm, plan.add({n.post_attention_norm}, DType::kF32));
    LITELLAMA_RETURN_IF_ERROR(add_projection({n.gate, n.up}, {}, &li.gate_up, &li.gate_up_q));
    LITELLAMA_RETURN_IF_ERROR(add_projection({n.down}, {}, &li.down, &li.down_q));
  }

  CudaWeights w;
  w.input_norms_folded = fold_input_norms;
  LITELLAMA_ASSIGN_OR_RETURN(w.storage, DeviceBuffer::allocate(plan.total_bytes()));
  LITELLAMA_RETURN_IF_ERROR(plan.upload(w.storage));
  auto at = [&](size_t i) { return w.storage.as<char>(plan.offset(i)); };
  auto at_f32 = [&](size_t i) { return w.storage.as<const float>(plan.offset(i)); };
  w.embed = at(embed);
  w.lm_head = at(lm_head);
  w.final_norm = at_f32(final_norm);
  w.layers.resize(index.size());
  for (size_t l = 0; l < index.size(); ++l) {
    const LayerIndex& li = index[l];
    CudaLayerWeights& L = w.layers[l];
    // A quantized projection has no dense matrix; its W4Weight or Fp8Weight says where its
    // arrays are.
    auto projection = [&](size_t dense, const std::optional<size_t>& quantized, const void** out,
                          W4Weight* out_w4, Fp8Weight* out_fp8) {
      if (quantized && fp8) {
        *out_fp8 = plan.fp8_weight(w.storage, *quantized);
        w.max_fp8_elements =
            std::max(w.max_fp8_elements, static_cast<int64_t>(out_fp8->n) * out_fp8->k);
      } else if (quantized) {
        *out_w4 = plan.w4_weight(w.storage, *quantized);
        w.max_w4_elements =
            std::max(w.max_w4_elements, static_cast<int64_t>(out_w4->n) * out_w4->k);
        w.w4_group = out_w4->group;
      } else {
        *out = at(dense);
      }
    };
    L.input_norm = at_f32(li.input_norm);
    projection(li.qkv, li.qkv_q, &L.qkv, &L.qkv_w4, &L.qkv_fp8);
    L.qkv_bias = c.qkv_bias ? at_f32(li.qkv_bias) : nullptr;
    L.q_norm = c.qk_norm ? at_f32(li.q_norm) : nullptr;
    L.k_norm = c.qk_norm ? at_f32(li.k_norm) : nullptr;
    projection(li.o, li.o_q, &L.o, &L.o_w4, &L.o_fp8);
    L.post_norm = at_f32(li.post_norm);
    projection(li.gate_up, li.gate_up_q, &L.gate_up, &L.gate_up_w4, &L.gate_up_fp8);
    projection(li.down, li.down_q, &L.down, &L.down_w4, &L.down_fp8);
  }
  return w;
}

}  // namespace litellama
