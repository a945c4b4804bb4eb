// UnicodeRegex: the pre-tokenizer split patterns of tokenizer.json (written for Oniguruma, as
// Hugging Face tokenizers uses) run on PCRE2 in UTF + UCP mode, JIT-compiled.
//
// What must stay true: Oniguruma's `\s` is Unicode White_Space (it includes U+0085 and the
// Unicode space separators) while PCRE2's UCP `\s` is not quite the same set, so `\s` and `\S`
// are rewritten to the explicit White_Space class before compiling. Everything else these
// patterns use (\p{L}, \p{N}, (?i:...), look-ahead, possessive-free alternation) has the same
// leftmost-first backtracking semantics in both engines.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace litellama {

class UnicodeRegex {
 public:
  static Result<UnicodeRegex> compile(std::string_view pattern);
  // A pattern that matches `literal` exactly.
  static std::string escape(std::string_view literal);

  // Calls on_match(begin, end) (byte offsets) for each successive non-empty, non-overlapping
  // match in `text`, which must be valid UTF-8. Runs in time linear in the text for the
  // tokenizer patterns; if PCRE2 gives up (resource limits), the rest of the text is left
  // unmatched rather than failing.
  void for_each_match(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

}  // namespace litellama
