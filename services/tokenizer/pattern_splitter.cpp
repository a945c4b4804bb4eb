#include "services/tokenizer/pattern_splitter.h"

#include <array>
#include <cstdint>

#include <utf8proc.h>

#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

// The split patterns exactly as tokenizer.json spells them.
constexpr std::string_view kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

CharClass classify(char32_t cp) {
  if (utf8::is_white_space(cp)) return kSpace;
  if (utf8::is_letter(cp)) return kLetter;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kNumber;
    default:
      return kOther;
  }
}

// Classes of the Basic Multilingual Plane, computed once; the other planes ask utf8proc.
struct ClassTable {
  std::array<uint8_t, 0x10000> bmp;
  ClassTable() {
    for (char32_t cp = 0; cp < 0x10000; ++cp) bmp[cp] = classify(cp);
  }
};

const ClassTable& class_table() {
  static const ClassTable table;
  return table;
}

struct Char {
  char32_t cp;
  uint32_t len;
  CharClass cls;
};

// Decodes the character at s[i] (the text is valid UTF-8).
inline Char char_at(std::string_view s, size_t i, const ClassTable& t) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  char32_t cp;
  uint32_t len;
  if (b0 < 0x80) {
    return {b0, 1, static_cast<CharClass>(t.bmp[b0])};
  } else if (b0 < 0xE0) {
    cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    len = 2;
  } else if (b0 < 0xF0) {
    cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    len = 3;
  } else {
    cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
         ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
    return {cp, 4, classify(cp)};
  }
  return {cp, len, static_cast<CharClass>(t.bmp[cp])};
}

// The end of the run of characters of class `cls` that starts at `i`.
inline size_t run_end(std::string_view s, size_t i, CharClass cls, const ClassTable& t) {
  while (i < s.size()) {
    const Char c = char_at(s, i, t);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

// Simple case folding of the letters the contractions use ('ſ' folds to 's').
inline char32_t fold(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + ('a' - 'A');
  if (cp == 0x17F) return 's';
  return cp;
}

inline bool is_newline(char32_t cp) {
  return cp == '\r' || cp == '\n';
}

}  // namespace

std::optional<PatternSplitter> PatternSplitter::find(std::string_view pattern) {
  if (pattern == kCl100kPattern) {
    return PatternSplitter(Options{true, true, false, 3, true, true});
  }
  if (pattern == kQwen2Pattern) {
    return PatternSplitter(Options{true, true, false, 1, true, true});
  }
  if (pattern == kGpt2Pattern) {
    return PatternSplitter(Options{false, false, true, 0, false, false});
  }
  return std::nullopt;
}

size_t PatternSplitter::match_at(std::string_view text, size_t pos) const {
  const ClassTable& t = class_table();
  const size_t n = text.size();
  const Char c = char_at(text, pos, t);
  const size_t p1 = pos + c.len;
  const bool has_next = p1 < n;
  const Char next = has_next ? char_at(text, p1, t) : Char{0, 0, kOther};

  // 's|'t|'re|'ve|'m|'ll|'d (optionally case-insensitive)
  if (c.cp == '\'' && has_next) {
    const char32_t x = options_.contractions_ignore_case ? fold(next.cp) : next.cp;
    if (x == 's' || x == 't' || x == 'm' || x == 'd') return p1 + next.len;
    const size_t p2 = p1 + next.len;
    if ((x == 'r' || x == 'v' || x == 'l') && p2 < n) {
      const Char third = char_at(text, p2, t);
      const char32_t y = options_.contractions_ignore_case ? fold(third.cp) : third.cp;
      if (y == (x == 'l' ? 'l' : 'e')) return p2 + third.len;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+  or   ?\p{L}+
  if (c.cls == kLetter) return run_end(text, p1, kLetter, t);
  if (next.cls == kLetter && has_next) {
    const bool prefix_ok =
        options_.letters_any_prefix ? (!is_newline(c.cp) && c.cls != kNumber) : c.cp == ' ';
    if (prefix_ok) return run_end(text, p1 + next.len, kLetter, t);
  }
  // \p{N}{1,max}  or   ?\p{N}+
  size_t digits_begin = SIZE_MAX;
  if (c.cls == kNumber) {
    digits_begin = pos;
  } else if (options_.digits_space_prefix && c.cp == ' ' && has_next && next.cls == kNumber) {
    digits_begin = p1;
  }
  if (digits_begin != SIZE_MAX) {
    if (options_.max_digits == 0) return run_end(text, digits_begin, kNumber, t);
    size_t e = digits_begin;
    for (int k = 0; k < options_.max_digits && e < n; ++k) {
      const Char d = char_at(text, e, t);
      if (d.cls != kNumber) break;
      e += d.len;
    }
    return e;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*  or   ?[^\s\p{L}\p{N}]+
  size_t punct_end = SIZE_MAX;
  if (c.cls == kOther) {
    punct_end = run_end(text, p1, kOther, t);
  } else if (c.cp == ' ' && has_next && next.cls == kOther) {
    punct_end = run_end(text, p1 + next.len, kOther, t);
  }
  if (punct_end != SIZE_MAX) {
    if (options_.punct_newlines) {
      while (punct_end < n && (text[punct_end] == '\r' || text[punct_end] == '\n')) ++punct_end;
    }
    return punct_end;
  }
  // c is white space: \s*[\r\n]+ | \s+(?!\S) | \s+
  size_t end = p1;
  size_t last_begin = pos;                                // the run's last character
  size_t newline_end = is_newline(c.cp) ? p1 : SIZE_MAX;  // after its last \r or \n
  while (end < n) {
    const Char w = char_at(text, end, t);
    if (w.cls != kSpace) break;
    last_begin = end;
    end += w.len;
    if (is_newline(w.cp)) newline_end = end;
  }
  if (options_.newline_run && newline_end != SIZE_MAX) return newline_end;
  if (end == n) return end;
  if (last_begin > pos) return last_begin;  // leave the last one to join what follows
  return end;
}

}  // namespace litellama
