// UTF-8 helpers shared by the tokenizer stages. Invalid input is never an error here: it is
// replaced, one U+FFFD per maximal ill-formed subsequence, exactly as Rust's
// String::from_utf8_lossy (and so Hugging Face tokenizers' byte-level decoder) does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace litellama::utf8 {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value) to `out`.
void append(std::string& out, char32_t cp);

// Result of looking at the start of `s`:
//   length > 0, valid:  a well-formed character of `length` bytes (code point in `cp`);
//   length > 0, !valid: a maximal ill-formed subsequence of `length` bytes (one U+FFFD);
//   incomplete: `s` ends inside a character that further bytes could still complete.
struct Sequence {
  int length = 0;
  bool valid = false;
  bool incomplete = false;
  char32_t cp = 0;
};
Sequence next(std::string_view s);

// Number of bytes at the end of `s` that form an incomplete (so far well-formed) character.
int incomplete_tail(std::string_view s);

bool is_valid(std::string_view s);

// from_utf8_lossy: well-formed text is copied, each maximal ill-formed subsequence becomes U+FFFD.
std::string lossy(std::string_view s);
void append_lossy(std::string& out, std::string_view s);

// Byte length of the character starting at s[0] (1 for a stray byte); s must be valid UTF-8.
inline int char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Python's str.isspace() for one code point (used by the chat templates' strip and trim).
bool is_python_space(char32_t cp);
// Unicode White_Space (what the split regexes call \s).
bool is_white_space(char32_t cp);
// A letter of Unicode general category L (Lu, Ll, Lt, Lm, Lo): regex \p{L}, Python str.isalpha().
bool is_letter(char32_t cp);

}  // namespace litellama::utf8
