// PatternSplitter: hand-written matchers for the split regexes that nearly every byte-level BPE
// tokenizer uses, so that encoding does not go through a general regex engine for them:
//
//   GPT-4 / Llama 3 (cl100k-style), and Qwen2 (the same with \p{N} instead of \p{N}{1,3}):
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//     \s*[\r\n]+|\s+(?!\S)|\s+
//   GPT-2 (ByteLevel's use_regex):
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// `find` recognizes these exact pattern strings; any other pattern stays on UnicodeRegex's PCRE2
// path. The matches are the ones Oniguruma's leftmost-first backtracking gives (and PCRE2's,
// which tests/tokenizer/pattern_splitter_test.cpp checks on the golden corpus and on random
// text): for these patterns every position starts a match, so the matches tile the text and each
// is found by looking at the first one or two characters and then one greedy run.
//
// What must stay true: \p{L} and \p{N} are the Unicode general categories L* and N* (utf8proc's
// tables), \s is Unicode White_Space (as Oniguruma's \s; utf8::is_white_space), and the
// case-insensitive contractions also match the case-folding equivalents PCRE2 and Oniguruma
// accept ('ſ' U+017F for 's').
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace litellama {

class PatternSplitter {
 public:
  // The splitter for `pattern` when it is one of the known patterns above.
  static std::optional<PatternSplitter> find(std::string_view pattern);

  // Calls on_match(begin, end) (byte offsets) for each successive match in `text`, which must be
  // valid UTF-8; the matches are non-empty and cover the text.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = match_at(text, pos);
      on_match(pos, end);
      pos = end;
    }
  }

  // The end of the match that starts at `pos` (< text.size()).
  size_t match_at(std::string_view text, size_t pos) const;

 private:
  struct Options {
    bool contractions_ignore_case;  // (?i:'s|...) rather than 's|...
    bool letters_any_prefix;        // [^\r\n\p{L}\p{N}]?\p{L}+ rather than ` ?\p{L}+`
    bool digits_space_prefix;       // ` ?\p{N}+` (GPT-2)
    int max_digits;                 // \p{N}{1,max}; 0: unbounded
    bool punct_newlines;            // ` ?[^\s\p{L}\p{N}]+[\r\n]*` rather than without [\r\n]*
    bool newline_run;               // the \s*[\r\n]+ alternative
  };
  explicit PatternSplitter(Options options) : options_(options) {}
  Options options_;
};

}  // namespace litellama
