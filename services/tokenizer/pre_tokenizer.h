// PreTokenizer: the `pre_tokenizer` of tokenizer.json, which cuts normalized text into the words
// BPE merges inside. Supported: Split (regex or string pattern; Isolated, Removed,
// MergedWithPrevious, MergedWithNext; invert), ByteLevel (with or without its GPT-2 regex and
// prefix space), Metaspace (prepend_scheme always/first/never, split) and Sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/tokenizer/unicode_regex.h"

namespace litellama {

class PreTokenizer {
 public:
  // `j` is the "pre_tokenizer" value of tokenizer.json (may be null: the whole piece is a word).
  static Result<PreTokenizer> from_json(const nlohmann::json& j);
  // The SentencePiece-style pre-tokenizer transformers' LlamaTokenizer installs.
  static PreTokenizer metaspace(std::string replacement, std::string prepend_scheme, bool split);

  // Appends the words of `text` to `words`. `at_origin` tells whether `text` starts at offset 0
  // of the original input (Metaspace's "first" scheme prepends only there).
  void pre_tokenize(std::string_view text, bool at_origin, std::vector<std::string>& words) const;

  // The byte-level pre-tokenizers of GPT-2 / Llama 3 / Qwen in one pass: when this one is a
  // ByteLevel with its regex, or an Isolated, non-inverted Split followed by a ByteLevel without
  // regex (and no other step), returns that regex: pre_tokenize() then gives the matches of the
  // regex in the text (after byte_level_prefix_space()'s space), each mapped byte by byte to the
  // GPT-2 alphabet. Encoding uses this to feed raw matches straight to the BPE model.
  const UnicodeRegex* byte_level_split() const { return byte_level_split_; }
  // Whether that ByteLevel prepends a space to text that does not start with one.
  bool byte_level_prefix_space() const { return byte_level_prefix_space_; }

  PreTokenizer() = default;
  PreTokenizer(PreTokenizer&& other) noexcept { *this = std::move(other); }
  PreTokenizer& operator=(PreTokenizer&& other) noexcept;

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };
  struct Step {
    Kind kind;
    UnicodeRegex regex;  // Split, or ByteLevel with use_regex
    bool use_regex = false;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    std::string replacement;     // Metaspace
    std::string prepend_scheme;  // Metaspace: always | first | never
    bool split = false;          // Metaspace
  };
  struct Piece {
    std::string text;
    bool at_origin;
  };
  // One step of the section (not null, not a Sequence), of tokenizer.json type `type`.
  static Status add_one(const nlohmann::json& j, const std::string& type, std::vector<Step>& steps);
  static void split_pieces(const UnicodeRegex& regex, Behavior behavior, bool invert,
                           std::vector<Piece>& pieces);
  void find_byte_level_split();
  std::vector<Step> steps_;
  const UnicodeRegex* byte_level_split_ = nullptr;  // points into steps_
  bool byte_level_prefix_space_ = false;
};

}  // namespace litellama
