#include "services/tokenizer/jinja_lexer.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "services/tokenizer/jinja_value.h"
#include "services/tokenizer/utf8.h"

namespace litellama::jinja {
namespace {

bool is_py_space_at(std::string_view s, size_t i, size_t* len) {
  const utf8::Sequence seq = utf8::next(s.substr(i));
  *len = static_cast<size_t>(std::max(1, seq.length));
  return seq.valid && utf8::is_python_space(seq.cp);
}

std::string rstrip_ws(const std::string& s) {
  return py_strip(s, false, true, std::nullopt);
}

std::string unescape_string(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int n) -> char32_t {
      const std::string h(body.substr(i + 1, n));
      if (static_cast<int>(h.size()) != n ||
          h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        fail(fmt::format("line {}: invalid \\{} escape in a string literal", line, e));
      }
      i += n;
      return static_cast<char32_t>(std::stoul(h, nullptr, 16));
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        utf8::append(out, hex(2));
        break;
      case 'u':
        utf8::append(out, hex(4));
        break;
      case 'U':
        utf8::append(out, hex(8));
        break;
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          utf8::append(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(normalize_newlines(std::move(source))) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    size_t pos = 0;
    while (pos <= src_.size()) {
      const size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag - pos);
      const bool line_start = pos == 0 || src_[pos - 1] == '\n';
      if (tag >= src_.size()) {
        if (!text.empty()) out.push_back({Tok::kText, std::move(text), line_at(pos)});
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (mod == '-') {
        text = rstrip_ws(text);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: drop the indentation before a block or comment that starts its line.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_start) {
          const std::string tail = text.substr(l_pos);
          if (!tail.empty() && rstrip_ws(tail).empty()) text.resize(l_pos);
        }
      }
      if (!text.empty()) out.push_back({Tok::kText, std::move(text), line_at(pos)});
      size_t p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      bool strip_after = false, keep_newline = false;
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string::npos) fail(fmt::format("line {}: unclosed comment", line_at(tag)));
        strip_after = end > p && src_[end - 1] == '-';
        keep_newline = end > p && src_[end - 1] == '+';
        p = end + 2;
      } else {
        const int line = line_at(tag);
        out.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line});
        p = lex_tag(p, kind == '{' ? '}' : '%', out, &strip_after, &keep_newline, line);
      }
      if (strip_after) {
        size_t len = 0;
        while (p < src_.size() && is_py_space_at(src_, p, &len)) p += len;
      } else if (kind != '{' && !keep_newline && p < src_.size() && src_[p] == '\n') {
        ++p;  // trim_blocks
      }
      pos = p;
      if (pos == src_.size()) break;
    }
    out.push_back({Tok::kEof, "", line_at(src_.size())});
    return out;
  }

 private:
  static std::string normalize_newlines(std::string s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\r') {
        out += '\n';
        if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      } else {
        out += s[i];
      }
    }
    // Jinja drops a single trailing newline of the template (keep_trailing_newline=False).
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return src_.size();
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  int line_at(size_t pos) const {
    return 1 +
           static_cast<int>(std::count(
               src_.begin(), src_.begin() + static_cast<long>(std::min(pos, src_.size())), '\n'));
  }

  // Lexes expression tokens up to the closing "}}" or "%}"; returns the position after it.
  size_t lex_tag(size_t p, char closer, std::vector<Token>& out, bool* strip_after,
                 bool* keep_newline, int line) {
    static const char* kOps3[] = {"**", "//", "==", "!=", "<=", ">="};
    while (true) {
      while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n')) ++p;
      if (p >= src_.size()) fail(fmt::format("line {}: unclosed tag", line));
      // Closers: "-}}", "}}", "-%}", "+%}", "%}".
      auto closes_at = [&](size_t q) {
        return q + 1 < src_.size() && src_[q] == closer && src_[q + 1] == '}';
      };
      if ((src_[p] == '-' || src_[p] == '+') && closes_at(p + 1)) {
        *strip_after = src_[p] == '-';
        *keep_newline = src_[p] == '+';
        out.push_back({closer == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", line});
        return p + 3;
      }
      if (closes_at(p)) {
        out.push_back({closer == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", line});
        return p + 2;
      }
      const char c = src_[p];
      if (c == '\'' || c == '"') {
        size_t q = p + 1;
        while (q < src_.size() && src_[q] != c) {
          if (src_[q] == '\\') ++q;
          ++q;
        }
        if (q >= src_.size()) fail(fmt::format("line {}: unterminated string literal", line));
        out.push_back({Tok::kString,
                       unescape_string(std::string_view(src_).substr(p + 1, q - p - 1), line),
                       line});
        p = q + 1;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t q = p;
        bool is_float = false;
        while (q < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_'))
          ++q;
        if (q + 1 < src_.size() && src_[q] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
          is_float = true;
          ++q;
          while (q < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_'))
            ++q;
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
            is_float = true;
            q = r;
            while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
          }
        }
        std::string num = src_.substr(p, q - p);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        out.push_back({is_float ? Tok::kFloat : Tok::kInt, num, line});
        p = q;
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_'))
          ++q;
        out.push_back({Tok::kName, src_.substr(p, q - p), line});
        p = q;
        continue;
      }
      bool matched = false;
      for (const char* op : kOps3) {
        if (src_.compare(p, 2, op) == 0) {
          out.push_back({Tok::kOp, op, line});
          p += 2;
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (std::string_view("()[]{},.:|~+-*/%<>=!").find(c) != std::string_view::npos) {
        out.push_back({Tok::kOp, std::string(1, c), line});
        ++p;
        continue;
      }
      fail(fmt::format("line {}: unexpected character '{}' in a tag", line, c));
    }
  }

  std::string src_;
};

}  // namespace

std::vector<Token> tokenize(std::string source) {
  return Lexer(std::move(source)).run();
}

}  // namespace litellama::jinja
