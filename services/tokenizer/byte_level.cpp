#include "services/tokenizer/byte_level.h"

#include "services/tokenizer/utf8.h"

namespace litellama {

const ByteLevel& ByteLevel::get() {
  static const ByteLevel kInstance;
  return kInstance;
}

ByteLevel::ByteLevel() {
  byte_of_cp_.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    utf8::append(utf8_of_byte_[b], cp);
    byte_of_cp_[cp] = static_cast<int16_t>(b);
  }
}

void ByteLevel::encode(std::string_view bytes, std::string& out) const {
  for (const char c : bytes) out.append(utf8_of_byte_[static_cast<unsigned char>(c)]);
}

bool ByteLevel::decode(std::string_view token, std::string& out) const {
  const size_t mark = out.size();
  size_t i = 0;
  while (i < token.size()) {
    const utf8::Sequence seq = utf8::next(token.substr(i));
    const auto b = seq.valid ? byte_of(seq.cp) : std::nullopt;
    if (!b) {
      out.resize(mark);
      return false;
    }
    out.push_back(static_cast<char>(*b));
    i += seq.length;
  }
  return true;
}

}  // namespace litellama
