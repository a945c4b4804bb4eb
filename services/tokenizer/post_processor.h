// PostProcessor: the `post_processor` of tokenizer.json, which adds the special tokens of a
// single sequence when encode() is asked to (add_special_tokens). Supported: TemplateProcessing
// (its "single" template), ByteLevel (no change to ids), RobertaProcessing, BertProcessing,
// Sequence, and null.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

class PostProcessor {
 public:
  static Result<PostProcessor> from_json(const nlohmann::json& j);

  void apply(std::vector<int32_t>& ids) const;
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  Status add(const nlohmann::json& j);
  std::vector<int32_t> prefix_, suffix_;
};

}  // namespace litellama
