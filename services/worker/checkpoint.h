// Checkpoint: a Hugging Face model directory as published (config.json, model.safetensors or a
// sharded model.safetensors.index.json), memory-mapped. Open validates every tensor the config
// implies (present, shape, dtype, inside its file) so backends can take weights without checks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "services/worker/llava_config.h"
#include "services/worker/model_config.h"
#include "services/worker/quantized_linear.h"
#include "services/worker/tensor_view.h"

namespace litellama {

// Tensor names of one decoder layer, per architecture.
struct LayerTensorNames {
  std::string input_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm;
  std::string post_attention_norm, gate, up, down;
};

class Checkpoint {
 public:
  // Opens and validates `dir`. Errors say which file or tensor is wrong and how.
  static Result<Checkpoint> open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or kNotFound.
  Result<TensorView> tensor(const std::string& name) const;
  std::vector<std::string> tensor_names() const;

  LayerTensorNames layer_names(int32_t layer) const;
  std::string embed_name() const { return config_.text_prefix + "embed_tokens.weight"; }
  std::string final_norm_name() const { return config_.text_prefix + "norm.weight"; }
  // lm_head.weight, or the embedding when the embeddings are tied.
  std::string lm_head_name() const;

  // A decoder layer's linear weight (a LayerTensorNames projection name, "<module>.weight") as
  // float32 [out_features, in_features]: a copy of the dense tensor, or the dequantization of
  // the module's tensors when config().quant stores it quantized (services/worker/
  // quantized_linear.h). Each tensor read goes through the read observer.
  Result<std::vector<float>> linear_f32(const std::string& weight_name) const;
  // Whether that module is stored quantized.
  bool is_quantized(const std::string& weight_name) const;
  // That module's 4-bit codes, zero points and scales (AWQ, or 4-bit GPTQ without act-order;
  // kUnsupported otherwise), for backends that keep the weights quantized.
  Result<Int4Linear> int4_linear(const std::string& weight_name) const;
  // That module's e4m3 codes and per-column scales (FP8 checkpoints; kUnsupported otherwise).
  Result<Fp8Linear> fp8_linear(const std::string& weight_name) const;
  // [out_features, in_features] of a layer projection named as in LayerTensorNames.
  Result<std::pair<int64_t, int64_t>> linear_shape(const std::string& weight_name) const;

  // LLaVA checkpoints: the vision half of the config and where its tensors are; nullptr else.
  const LlavaConfig* llava() const { return llava_ ? &*llava_ : nullptr; }
  const LlavaTensorNames& llava_names() const { return llava_names_; }

  // Total bytes of all tensors (as stored).
  size_t size_bytes() const;
  // Bytes of the tensors of each weight file, in file order (one entry when not sharded).
  std::vector<int64_t> shard_bytes() const;

  // Called with each tensor a backend takes through tensor(), before it reads the data: start-up
  // progress. A tensor taken twice (tied embeddings) is reported twice.
  void set_read_observer(std::function<void(const TensorView&)> observer) {
    read_observer_ = std::move(observer);
  }

 private:
  Status validate() const;

  std::string dir_;
  ModelConfig config_;
  std::optional<LlavaConfig> llava_;
  LlavaTensorNames llava_names_;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  std::function<void(const TensorView&)> read_observer_;
};

}  // namespace litellama
