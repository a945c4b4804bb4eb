// BpeModel: the BPE `model` of tokenizer.json (vocab, ranked merges, byte fallback, unk).
//
// Merging follows Hugging Face tokenizers' Word::merge_all exactly: a min-heap of candidate
// pairs ordered by (rank, position) over a doubly linked list of symbols, O(n log n) per word,
// so a word of a million characters is fine. Words are memoized in a bounded cache shared by
// all threads (a mutex guards it; the cache never changes results).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/tokenizer/flat_token_map.h"

namespace litellama {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json; its type must be BPE.
  static Result<BpeModel> from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  // Byte-level models (GPT-2 alphabet: every byte is one character of the vocabulary) can take
  // pre-tokenized words as raw bytes, skipping the mapping to the alphabet: tokenize_bytes(raw)
  // appends exactly what tokenize(ByteLevel-encoded raw) does. enable_raw_bytes() builds the
  // raw-byte vocabulary and says whether the model qualifies (all 256 byte characters in the
  // vocabulary, no continuing_subword_prefix / end_of_word_suffix); call it once, before any
  // encoding, and tokenize_bytes() only when it returned true.
  bool enable_raw_bytes();
  void tokenize_bytes(std::string_view raw, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of `id`, or nullptr when the model has no such id.
  const std::string* id_to_token(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool byte_fallback() const { return byte_fallback_; }

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

 private:
  BpeModel();
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_raw_bytes(std::string_view raw, std::vector<int32_t>& ids) const;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;  // bytes; 0 once merged into its left neighbour
  };
  void merge_symbols(std::vector<Symbol>& symbols, std::vector<int32_t>& ids) const;

  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  // (left id, right id) -> Merge: open addressing over a power-of-two table of 16-byte slots,
  // one probe per lookup in the common case (BPE looks up every adjacent pair it considers).
  class MergeTable {
   public:
    void reserve(size_t n);
    // Keeps the first merge given for a pair.
    void insert(int32_t left, int32_t right, Merge merge);
    const Merge* find(int32_t left, int32_t right) const {
      if (slots_.empty()) return nullptr;
      const uint64_t key = pair_key(left, right);
      for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.key == key) return &s.merge;
        if (s.key == kEmptyKey) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmptyKey = ~0ull;
    struct Slot {
      uint64_t key = kEmptyKey;
      Merge merge{0, 0};
    };
    static uint64_t pair_key(int32_t a, int32_t b) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    size_t slot_of(uint64_t key) const {
      return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
    }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    int shift_ = 64;
    size_t size_ = 0;
  };
  // Merging by repeated scans for the lowest (rank, position) pair: for short words this is
  // faster than the heap and gives the same merges (see merge_symbols).
  void merge_by_scan(const std::vector<Symbol>& symbols, std::vector<int32_t>& ids) const;
  struct Cache;

  TokenIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::vector<int32_t> byte_ids_;  // id of "<0xXX>" per byte, -1 when absent
  std::unique_ptr<Cache> cache_;
  // Raw-byte input (enable_raw_bytes): the vocabulary keyed by the bytes each token stands for,
  // the id of each byte's single-character token, and a word cache of its own.
  std::unique_ptr<FlatTokenMap> raw_vocab_;
  std::array<int32_t, 256> raw_byte_ids_{};
  std::unique_ptr<Cache> raw_cache_;
};

}  // namespace litellama
