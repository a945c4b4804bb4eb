// Normalizer: the `normalizer` of tokenizer.json, applied to each piece of input text between
// added tokens. Supported: NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace (string pattern),
// Lowercase, Sequence, and null (identity).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

class Normalizer {
 public:
  // `j` is the "normalizer" value of tokenizer.json (may be null).
  static Result<Normalizer> from_json(const nlohmann::json& j);

  // `text` must be valid UTF-8; it stays valid UTF-8.
  void normalize(std::string& text) const;
  bool is_identity() const { return steps_.empty(); }

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kPrepend, kReplace, kLowercase };
  struct Step {
    Kind kind;
    std::string a;  // Prepend: prefix; Replace: pattern
    std::string b;  // Replace: content
  };
  // One step of the section (not null, not a Sequence), of tokenizer.json type `type`.
  static Status add_one(const nlohmann::json& j, const std::string& type, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace litellama
