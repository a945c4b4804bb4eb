// UnicodeRegex: the pre-tokenizer split patterns of tokenizer.json (written for Oniguruma, as
// Hugging Face tokenizers uses) run on PCRE2 in UTF + UCP mode, JIT-compiled. The patterns of
// the GPT-2, GPT-4/Llama 3 and Qwen2 families run on hand-written matchers instead
// (PatternSplitter), which give the same matches several times faster; Engine::kPcre2 forces
// PCRE2 (the tests compare the two).
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
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "services/tokenizer/pattern_splitter.h"

namespace litellama {

class UnicodeRegex {
 public:
  enum class Engine { kAuto, kPcre2 };
  // kAuto: the hand-written matcher when the pattern is one PatternSplitter knows, else PCRE2.
  static Result<UnicodeRegex> compile(std::string_view pattern, Engine engine = Engine::kAuto);
  // A pattern that matches `literal` exactly.
  static std::string escape(std::string_view literal);

  // Calls on_match(begin, end) (byte offsets) for each successive non-empty, non-overlapping
  // match in `text`, which must be valid UTF-8. Runs in time linear in the text for the
  // tokenizer patterns; if PCRE2 gives up (resource limits), the rest of the text is left
  // unmatched rather than failing.
  void for_each_match(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;

  // The same, with the callback inlined into the hand-written matchers' loop.
  template <typename F>
  void for_each(std::string_view text, F&& on_match) const {
    if (splitter_) {
      splitter_->for_each_match(text, on_match);
      return;
    }
    for_each_match(text, std::function<void(size_t, size_t)>(std::ref(on_match)));
  }

  const std::string& pattern() const { return pattern_; }
  bool hand_written() const { return splitter_.has_value(); }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
  std::optional<PatternSplitter> splitter_;
};

}  // namespace litellama
