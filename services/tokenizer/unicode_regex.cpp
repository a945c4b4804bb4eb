#define PCRE2_CODE_UNIT_WIDTH 8
#include "services/tokenizer/unicode_regex.h"

#include <pcre2.h>

#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

// Unicode White_Space, as Oniguruma's \s.
constexpr std::string_view kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

Result<std::string> translate(std::string_view p) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class) {
          return make_error(StatusCode::kUnsupported,
                            "split pattern uses \\S inside a character class: {}", p);
        }
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
        class_start = out.size();
      }
      continue;
    }
    if (in_class && c == ']' && out.size() > class_start) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct UnicodeRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<UnicodeRegex> UnicodeRegex::compile(std::string_view pattern, Engine engine) {
  LITELLAMA_ASSIGN_OR_RETURN(const std::string translated, translate(pattern));
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return make_error(StatusCode::kUnsupported, "cannot compile split pattern '{}': {} at {}",
                      pattern, reinterpret_cast<const char*>(message), offset);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  UnicodeRegex r;
  auto holder = std::make_shared<Code>();
  holder->code = code;
  r.code_ = std::move(holder);
  r.pattern_ = std::string(pattern);
  if (engine == Engine::kAuto) r.splitter_ = PatternSplitter::find(pattern);
  return r;
}

std::string UnicodeRegex::escape(std::string_view literal) {
  std::string out = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal.compare(i, 2, "\\E") == 0) {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out += literal[i];
    }
  }
  return out + "\\E";
}

namespace {

// Per-thread match state, shared by every pattern: a JIT stack (reserved once, grown on demand
// by PCRE2 up to its maximum) and match data holding the whole-match offsets.
struct ThreadMatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (stack != nullptr) pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    if (stack != nullptr) pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

}  // namespace

void UnicodeRegex::for_each_match(std::string_view text,
                                  const std::function<void(size_t, size_t)>& on_match) const {
  if (splitter_) {
    splitter_->for_each_match(text, on_match);
    return;
  }
  thread_local ThreadMatchState state;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                               state.md, state.mctx);
    if (rc < 0) break;  // no match, or a resource limit: the rest stays unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.md);
    const size_t b = ov[0], e = ov[1];
    if (e <= b) {
      if (b >= text.size()) break;
      // Empty match: step over one character and search again.
      start = b + static_cast<size_t>(utf8::char_length(static_cast<unsigned char>(text[b])));
      continue;
    }
    on_match(b, e);
    start = e;
  }
}

}  // namespace litellama
