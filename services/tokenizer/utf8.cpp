#include "services/tokenizer/utf8.h"

#include <cstring>

#include <utf8proc.h>

namespace litellama::utf8 {

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Sequence next(std::string_view s) {
  Sequence r;
  if (s.empty()) return r;
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {1, true, false, b0};
  int need = 0;
  char32_t cp = 0;
  // Allowed range of the second byte (Unicode Table 3-7, well-formed byte sequences).
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false, 0};
  }
  for (int i = 1; i <= need; ++i) {
    if (i >= static_cast<int>(s.size())) return {i, false, true, 0};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {i, false, false, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {need + 1, true, false, cp};
}

int incomplete_tail(std::string_view s) {
  // A character is at most 4 bytes, so only the last 3 bytes can start an incomplete one.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const Sequence seq = next(s.substr(n - back));
    return seq.incomplete ? static_cast<int>(back) : 0;
  }
  return 0;
}

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Eight ASCII bytes at a time.
    if (i + 8 <= s.size()) {
      uint64_t chunk;
      std::memcpy(&chunk, s.data() + i, 8);
      if ((chunk & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Sequence seq = next(s.substr(i));
    if (!seq.valid) return false;
    i += seq.length;
  }
  return true;
}

void append_lossy(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    out.append(s.substr(i, j - i));
    i = j;
    if (i >= s.size()) break;
    const Sequence seq = next(s.substr(i));
    if (seq.valid) {
      out.append(s.substr(i, seq.length));
    } else {
      out.append(kReplacement);
    }
    i += seq.length;
  }
}

std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_lossy(out, s);
  return out;
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_letter(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_python_space(char32_t cp) {
  return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

}  // namespace litellama::utf8
