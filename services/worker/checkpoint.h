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
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "services/worker/llava_config.h"
#include "services/worker/model_config.h"

namespace litellama {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping; valid while the Checkpoint lives
  size_t size_bytes = 0;
  int32_t shard = 0;  // index of the file that holds it (Checkpoint::shard_bytes)

  int64_t numel() const;
  // Copies into float32 (upcasting bf16/fp16).
  std::vector<float> to_f32() const;
};

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
