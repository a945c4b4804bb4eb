// AddedVocabulary: the added tokens of tokenizer.json (special tokens such as <|eot_id|> and
// plain added tokens such as <think>). They are matched in the raw input before anything else,
// leftmost-longest as Hugging Face's Aho-Corasick matcher does, so text that spells a special
// token becomes that token, whether or not special tokens are being added.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace litellama {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedVocabulary {
 public:
  struct Segment {
    std::string_view text;
    std::optional<int32_t> id;  // set when the segment is an added token
    size_t offset;              // byte offset in the text given to split()
  };

  // Adds or replaces (same id) a token; call build() once all are added.
  void add(AddedToken token);
  void build();

  // Cuts `text` into added tokens and the text between them (never empty segments). `normalized`
  // selects the tokens matched after normalization (normalized=true) or before it.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

  const AddedToken* find(int32_t id) const;
  std::optional<int32_t> find(std::string_view content) const;
  bool has_normalized() const { return has_normalized_; }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;  // index into tokens_ of a token ending here
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    std::array<bool, 256> first_byte{};  // bytes some token starts with
    int only_first_byte = -1;            // the one such byte when all tokens share it, else -1
    void insert(std::string_view s, int32_t token);
    // Length and token index of the longest token starting at text[pos].
    std::optional<std::pair<size_t, int32_t>> longest(std::string_view text, size_t pos) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  Trie raw_trie_, normalized_trie_;
  bool has_normalized_ = false;
};

}  // namespace litellama
