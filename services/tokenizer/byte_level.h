// The GPT-2 byte-level alphabet: every byte 0..255 is shown as one printable code point so that
// BPE can work on text made of 256 "characters" (space is 'Ġ' U+0120, newline 'Ċ' U+010A).
// Printable Latin-1 bytes map to themselves; the others map to U+0100 + n in byte order.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace litellama {

class ByteLevel {
 public:
  static const ByteLevel& get();

  // Appends the byte-level form of every byte of `bytes`.
  void encode(std::string_view bytes, std::string& out) const;
  // The byte a code point of the byte-level alphabet stands for, if it is one.
  std::optional<uint8_t> byte_of(char32_t cp) const {
    if (cp < byte_of_cp_.size() && byte_of_cp_[cp] >= 0)
      return static_cast<uint8_t>(byte_of_cp_[cp]);
    return std::nullopt;
  }
  // Decodes a token made only of byte-level code points into bytes; false if some code point is
  // not in the alphabet (Hugging Face then keeps the token's own UTF-8 bytes).
  bool decode(std::string_view token, std::string& out) const;

 private:
  ByteLevel();
  std::array<std::string, 256> utf8_of_byte_;
  std::array<int16_t, 324> byte_of_cp_;
};

}  // namespace litellama
