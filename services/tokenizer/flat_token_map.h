// FlatTokenMap: token string -> id, for the lookups on the encode path (one per pre-tokenized
// word). An open-addressing table (linear probing) of 16-byte slots that hold keys of up to 8
// bytes inline and longer ones in one arena, so a lookup touches one slot (and, for a long key,
// its bytes) and allocates nothing; a node-based std::unordered_map costs several dependent
// cache misses per lookup on a 150k-token vocabulary. Built once, then only read (safe from many
// threads).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace litellama {

class FlatTokenMap {
 public:
  static constexpr int32_t kMissing = -1;

  explicit FlatTokenMap(size_t expected_size) {
    size_t capacity = 16;
    while (capacity < expected_size * 2) capacity *= 2;
    slots_.assign(capacity, Slot{0, kEmpty, kMissing});
    mask_ = capacity - 1;
  }

  // Adds `key` unless it is already present (the first id given for a key stays).
  void insert(std::string_view key, int32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    const Key k = make_key(key);
    for (size_t i = k.hash & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.length == kEmpty) {
        uint64_t stored = k.inline_bytes;
        if (key.size() > kInlineBytes) {
          stored = (k.hash & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(arena_.size());
          arena_.append(key);
        }
        s = Slot{stored, static_cast<uint32_t>(key.size()), id};
        ++size_;
        return;
      }
      if (matches(s, k, key)) return;
    }
  }

  // The id of `key`, or kMissing.
  int32_t find(std::string_view key) const {
    const Key k = make_key(key);
    for (size_t i = k.hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.length == kEmpty) return kMissing;
      if (matches(s, k, key)) return s.id;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  static constexpr size_t kInlineBytes = 8;
  // A key of up to 8 bytes is stored in the slot itself (zero-padded), so looking up a short
  // word touches one cache line; a longer key is stored as (high half of its hash, offset of its
  // bytes in arena_).
  struct Slot {
    uint64_t key;
    uint32_t length;  // kEmpty for a free slot
    int32_t id;
  };
  struct Key {
    uint64_t hash;
    uint64_t inline_bytes;  // the key's bytes, zero-padded, when it has at most 8
  };

  bool matches(const Slot& s, const Key& k, std::string_view key) const {
    if (s.length != key.size()) return false;
    if (key.size() <= kInlineBytes) return s.key == k.inline_bytes;
    return (s.key & 0xFFFFFFFF00000000ull) == (k.hash & 0xFFFFFFFF00000000ull) &&
           std::memcmp(arena_.data() + static_cast<uint32_t>(s.key), key.data(), key.size()) == 0;
  }

  static uint64_t mix(uint64_t h) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
  }

  // A multiply-xorshift hash over 8-byte chunks (keys are a few bytes long).
  static Key make_key(std::string_view key) {
    if (key.size() <= kInlineBytes) {
      uint64_t bytes = 0;
      std::memcpy(&bytes, key.data(), key.size());
      return {mix((bytes ^ (key.size() * 0x9E3779B97F4A7C15ull)) * 0xFF51AFD7ED558CCDull), bytes};
    }
    uint64_t h = 0x9E3779B97F4A7C15ull ^ key.size();
    size_t i = 0;
    for (; i + 8 <= key.size(); i += 8) {
      uint64_t chunk;
      std::memcpy(&chunk, key.data() + i, 8);
      h = (h ^ chunk) * 0xFF51AFD7ED558CCDull;
      h ^= h >> 32;
    }
    if (i < key.size()) {
      uint64_t chunk = 0;
      std::memcpy(&chunk, key.data() + i, key.size() - i);
      h = (h ^ chunk) * 0xFF51AFD7ED558CCDull;
    }
    return {mix(h), 0};
  }

  std::string_view stored_key(const Slot& s, std::string& scratch) const {
    if (s.length <= kInlineBytes) {
      scratch.assign(reinterpret_cast<const char*>(&s.key), s.length);
      return scratch;
    }
    return std::string_view(arena_.data() + static_cast<uint32_t>(s.key), s.length);
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{0, kEmpty, kMissing});
    mask_ = slots_.size() - 1;
    std::string scratch;
    for (const Slot& s : old) {
      if (s.length == kEmpty) continue;
      size_t i = make_key(stored_key(s, scratch)).hash & mask_;
      while (slots_[i].length != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace litellama
