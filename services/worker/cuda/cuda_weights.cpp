#include "services/worker/cuda/cuda_weights.h"

#include <cstring>
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
    LITELLAMA_ASSIGN_OR_RETURN(li.qkv, plan.add({n.q, n.k, n.v}, compute_dtype, input_scale));
    if (c.qkv_bias) {
      LITELLAMA_ASSIGN_OR_RETURN(li.qkv_bias,
                                 plan.add({n.q_bias, n.k_bias, n.v_bias}, DType::kF32));
    }
    if (c.qk_norm) {
      LITELLAMA_ASSIGN_OR_RETURN(li.q_norm, plan.add({n.q_norm}, DType::kF32));
      LITELLAMA_ASSIGN_OR_RETURN(li.k_norm, plan.add({n.k_norm}, DType::kF32));
    }
    LITELLAMA_ASSIGN_OR_RETURN(li.o, plan.add({n.o}, compute_dtype));
    LITELLAMA_ASSIGN_OR_RETURN(li.post_norm, plan.add({n.post_attention_norm}, DType::kF32));
    LITELLAMA_ASSIGN_OR_RETURN(li.gate_up, plan.add({n.gate, n.up}, compute_dtype));
    LITELLAMA_ASSIGN_OR_RETURN(li.down, plan.add({n.down}, compute_dtype));
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
    L.input_norm = at_f32(li.input_norm);
    L.qkv = at(li.qkv);
    L.qkv_bias = c.qkv_bias ? at_f32(li.qkv_bias) : nullptr;
    L.q_norm = c.qk_norm ? at_f32(li.q_norm) : nullptr;
    L.k_norm = c.qk_norm ? at_f32(li.k_norm) : nullptr;
    L.o = at(li.o);
    L.post_norm = at_f32(li.post_norm);
    L.gate_up = at(li.gate_up);
    L.down = at(li.down);
  }
  return w;
}

}  // namespace litellama
