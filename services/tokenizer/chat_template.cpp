#include "services/tokenizer/chat_template.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

// ================================================================================================
// Errors: thrown inside the interpreter, turned into a Status at the public API.
// ================================================================================================
struct TemplateError : std::runtime_error {
  TemplateError(StatusCode c, const std::string& m) : std::runtime_error(m), code(c) {}
  StatusCode code;
};

[[noreturn]] void fail(const std::string& message) {
  throw TemplateError(StatusCode::kInvalidArgument, message);
}
[[noreturn]] void unsupported(const std::string& message) {
  throw TemplateError(StatusCode::kUnsupported, message);
}

// Limits that keep a hostile or broken template from exhausting the stack, the memory or the
// time of the tokenizer: real chat templates nest a few levels, build strings of kilobytes and
// run thousands of statements.
constexpr int kMaxNesting = 64;     // blocks, parentheses, `not`/sign chains (parse recursion)
constexpr int kMaxExprDepth = 256;  // expression tree depth (evaluation recursion)
constexpr size_t kMaxValueBytes = size_t{16} << 20;  // a repeated string or list
constexpr int64_t kMaxRenderSteps = 10'000'000;      // statements and expressions evaluated

// Integer arithmetic as Python does it, except that a result outside int64 is an error.
[[noreturn]] void integer_overflow(int line) {
  fail(fmt::format("line {}: integer overflow", line));
}
int64_t add_checked(int64_t x, int64_t y, int line) {
  int64_t r = 0;
  if (__builtin_add_overflow(x, y, &r)) integer_overflow(line);
  return r;
}
int64_t sub_checked(int64_t x, int64_t y, int line) {
  int64_t r = 0;
  if (__builtin_sub_overflow(x, y, &r)) integer_overflow(line);
  return r;
}
int64_t mul_checked(int64_t x, int64_t y, int line) {
  int64_t r = 0;
  if (__builtin_mul_overflow(x, y, &r)) integer_overflow(line);
  return r;
}

// An integer or float literal; out of range is an error, not an exception of the std library.
int64_t int_literal(const std::string& text, int line) {
  int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
    fail(fmt::format("line {}: integer literal '{}' out of range", line, text));
  }
  return v;
}

// ================================================================================================
// Values: the Python objects a template sees.
// ================================================================================================
struct Value;
using List = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
struct Dict;
struct Callable;

struct Undefined {
  std::string name;  // what was looked up, for error messages
};
struct None {};

struct Value {
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Callable>>
      v;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}                     // NOLINT
  Value(None n) : v(n) {}                                     // NOLINT
  Value(bool b) : v(b) {}                                     // NOLINT
  Value(int64_t i) : v(i) {}                                  // NOLINT
  Value(int i) : v(static_cast<int64_t>(i)) {}                // NOLINT
  Value(size_t i) : v(static_cast<int64_t>(i)) {}             // NOLINT
  Value(double d) : v(d) {}                                   // NOLINT
  Value(std::string s) : v(std::move(s)) {}                   // NOLINT
  Value(const char* s) : v(std::string(s)) {}                 // NOLINT
  Value(List l) : v(std::make_shared<List>(std::move(l))) {}  // NOLINT
  Value(std::shared_ptr<List> l) : v(std::move(l)) {}         // NOLINT
  Value(std::shared_ptr<Dict> d) : v(std::move(d)) {}         // NOLINT
  Value(std::shared_ptr<Callable> c) : v(std::move(c)) {}     // NOLINT

  bool is_undefined() const { return std::holds_alternative<Undefined>(v); }
  bool is_none() const { return std::holds_alternative<None>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v) || is_bool(); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  List& list() const { return *std::get<std::shared_ptr<List>>(v); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(v); }
  Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v); }
  int64_t as_int() const {
    if (is_bool()) return std::get<bool>(v) ? 1 : 0;
    return std::get<int64_t>(v);
  }
  double as_double() const {
    return is_float() ? std::get<double>(v) : static_cast<double>(as_int());
  }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  bool is_loop = false;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [k, v] : items) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    items.emplace_back(key, std::move(value));
  }
};

struct Callable {
  std::string name;
  std::function<Value(std::vector<Value>&, KwArgs&)> fn;
};

Value make_callable(std::string name, std::function<Value(std::vector<Value>&, KwArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

const char* type_name(const Value& v) {
  if (v.is_undefined()) return "undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_list()) return "list";
  if (v.is_dict()) return v.dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool()) return std::get<bool>(v.v);
  if (v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_double() != 0.0;
  if (v.is_string()) return !v.str().empty();
  if (v.is_list()) return !v.list().empty();
  if (v.is_dict()) return v.dict().is_namespace || !v.dict().items.empty();
  return true;
}

// ---- UTF-8 code point views (Python indexes strings by code point) ----
std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    const int n = std::max(1, utf8::next(s.substr(i)).length);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}
char32_t decode_cp(std::string_view s) {
  return utf8::next(s).cp;
}

// ---- Python str() and repr() ----
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  // sci = [-]D[.DDD]e[+-]XX: Python's repr uses fixed notation for 1e-4 <= |d| < 1e16.
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp >= -5 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<size_t>(exp + 1 - digits.size()), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    // Python switches to scientific below 1e-4.
    if (exp < -4) {
      out = neg ? "-" : "";
      out += digits.substr(0, 1);
      if (digits.size() > 1) out += "." + digits.substr(1);
      out += fmt::format("e-{:02d}", -exp);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  return out;
}

std::string repr(const Value& v);

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return std::get<bool>(v.v) ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_double());
  if (v.is_string()) return v.str();
  return repr(v);
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (const auto cp_view : code_points(s)) {
    const char32_t cp = decode_cp(cp_view);
    if (cp == static_cast<char32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else {
      out += cp_view;
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v) {
  if (v.is_string()) return string_repr(v.str());
  if (v.is_list()) {
    std::string out = "[";
    bool first = true;
    for (const auto& x : v.list()) {
      if (!first) out += ", ";
      first = false;
      out += repr(x);
    }
    return out + "]";
  }
  if (v.is_dict()) {
    if (v.dict().is_namespace) return "<Namespace>";
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.dict().items) {
      if (!first) out += ", ";
      first = false;
      out += string_repr(k) + ": " + repr(x);
    }
    return out + "}";
  }
  if (v.is_callable()) return "<function " + v.callable().name + ">";
  return to_str(v);
}

// ---- json.dumps(ensure_ascii=False), as transformers' tojson filter ----
void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void to_json(std::string& out, const Value& v, int indent, int depth, const std::string& item_sep,
             const std::string& key_sep, bool sort_keys) {
  auto newline = [&](int d) {
    if (indent >= 0) {
      out += '\n';
      out.append(static_cast<size_t>(indent * d), ' ');
    }
  };
  if (v.is_undefined() || v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += std::get<bool>(v.v) ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_double();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : float_repr(d);
  } else if (v.is_string()) {
    json_string(out, v.str());
  } else if (v.is_list()) {
    const List& l = v.list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      to_json(out, l[i], indent, depth + 1, item_sep, key_sep, sort_keys);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict()) {
    auto items = v.dict().items;
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_string(out, items[i].first);
      out += key_sep;
      to_json(out, items[i].second, indent, depth + 1, item_sep, key_sep, sort_keys);
    }
    newline(depth);
    out += '}';
  } else {
    fail("Object of type function is not JSON serializable");
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None{};
    case nlohmann::ordered_json::value_t::boolean:
      return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer:
      return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned:
      return static_cast<int64_t>(j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return j.get<double>();
    case nlohmann::ordered_json::value_t::string:
      return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return l;
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it)
        d->items.emplace_back(it.key(), from_json(*it));
      return Value(d);
    }
    default:
      return Undefined{};
  }
}

// ---- comparisons with Python semantics ----
bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    if (&a.dict() == &b.dict()) return true;
    const auto &x = a.dict().items, &y = b.dict().items;
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x) {
      const Value* o = b.dict().find(k);
      if (!o || !equals(v, *o)) return false;
    }
    return true;
  }
  if (a.is_callable() && b.is_callable()) return &a.callable() == &b.callable();
  return false;
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // byte order of UTF-8 == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a),
                   type_name(b)));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      fail(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    }
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& x : container.list()) {
      if (equals(x, item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().find(item.str()) != nullptr;
  if (container.is_undefined()) return false;
  fail(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

List iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_undefined()) return {};
  if (v.is_string()) {
    List out;
    for (auto cp : code_points(v.str())) out.emplace_back(std::string(cp));
    return out;
  }
  if (v.is_dict() && !v.dict().is_namespace) {
    List out;
    for (const auto& [k, x] : v.dict().items) out.emplace_back(k);
    return out;
  }
  fail(fmt::format("'{}' object is not iterable", type_name(v)));
}

// ---- Python string helpers ----
bool in_chars(char32_t cp, const std::optional<std::string>& chars) {
  if (!chars) return utf8::is_python_space(cp);
  for (auto c : code_points(*chars)) {
    if (decode_cp(c) == cp) return true;
  }
  return false;
}

std::string py_strip(const std::string& s, bool left, bool right,
                     const std::optional<std::string>& chars) {
  const auto cps = code_points(s);
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && in_chars(decode_cp(cps[b]), chars)) ++b;
  }
  if (right) {
    while (e > b && in_chars(decode_cp(cps[e - 1]), chars)) --e;
  }
  if (b == e) return "";
  const size_t start = static_cast<size_t>(cps[b].data() - s.data());
  const size_t end = static_cast<size_t>(cps[e - 1].data() - s.data()) + cps[e - 1].size();
  return s.substr(start, end - start);
}

// Case mapping for ASCII and the common Latin-1/Greek/Cyrillic ranges is enough for role names
// and template text; other characters are left unchanged.
std::string map_case(const std::string& s, bool upper) {
  std::string out;
  for (auto cpv : code_points(s)) {
    char32_t cp = decode_cp(cpv);
    if (upper) {
      if ((cp >= 'a' && cp <= 'z') || (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) ||
          (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) || (cp >= 0x430 && cp <= 0x44F)) {
        cp -= 0x20;
      } else if (cp >= 0x450 && cp <= 0x45F) {
        cp -= 0x50;
      }
    } else {
      if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) ||
          (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) || (cp >= 0x410 && cp <= 0x42F)) {
        cp += 0x20;
      } else if (cp >= 0x400 && cp <= 0x40F) {
        cp += 0x50;
      }
    }
    utf8::append(out, cp);
  }
  return out;
}

bool is_alpha_cp(char32_t cp) {
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp >= 0xC0;
}

std::string title_case(const std::string& s) {
  std::string out;
  bool prev_alpha = false;
  for (auto cpv : code_points(s)) {
    const char32_t cp = decode_cp(cpv);
    std::string c(cpv);
    out += prev_alpha ? map_case(c, false) : map_case(c, true);
    prev_alpha = is_alpha_cp(cp);
  }
  return out;
}

std::string capitalize(const std::string& s) {
  const auto cps = code_points(s);
  if (cps.empty()) return s;
  std::string out = map_case(std::string(cps[0]), true);
  out += map_case(s.substr(cps[0].size()), false);
  return out;
}

List py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    // Split on runs of whitespace, dropping empty strings.
    const auto cps = code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && utf8::is_python_space(decode_cp(cps[i]))) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        const size_t start = static_cast<size_t>(cps[i].data() - s.data());
        out.emplace_back(py_strip(s.substr(start), false, true, std::nullopt));
        return out;
      }
      const size_t start = static_cast<size_t>(cps[i].data() - s.data());
      while (i < cps.size() && !utf8::is_python_space(decode_cp(cps[i]))) ++i;
      const size_t end = i < cps.size() ? static_cast<size_t>(cps[i].data() - s.data()) : s.size();
      out.emplace_back(s.substr(start, end - start));
    }
    return out;
  }
  if (!sep.is_string()) fail("must be str or None, not " + std::string(type_name(sep)));
  const std::string& d = sep.str();
  if (d.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t p = s.find(d, start);
    if (p == std::string::npos) break;
    out.emplace_back(s.substr(start, p - start));
    start = p + d.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::string out = to;
    int64_t n = 1;
    for (auto cp : code_points(s)) {
      out += cp;
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// ================================================================================================
// Lexer
// ================================================================================================
enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind;
  std::string text;
  int line = 1;
};

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

// ================================================================================================
// AST
// ================================================================================================
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kDict,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kBinary,
  kCompare,
  kAnd,
  kOr,
  kCond,
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int depth = 1;  // of the tree below and including this node (<= kMaxExprDepth)
  Value literal;
  std::string name;           // name, attribute, operator, filter or test
  std::vector<ExprPtr> args;  // operands / positional arguments
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // comparison chain operators
  bool negated = false;          // `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind { kText, kPrint, kIf, kFor, kSet, kSetBlock, kBreak, kContinue };

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;                                    // print / set value / for iterable / for filter
  ExprPtr filter;                                  // for ... if filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif (condition null for else)
  std::vector<std::string> targets;                // for / set targets
  std::string attr;                                // set ns.attr
  Body body, else_body;
};

// ================================================================================================
// Parser
// ================================================================================================
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  // Counts one level of parse recursion for its lifetime (see kMaxNesting).
  class Nesting {
   public:
    explicit Nesting(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) {
        --p_->depth_;
        fail(fmt::format("line {}: the template nests deeper than {} levels", p_->peek().line,
                         kMaxNesting));
      }
    }
    ~Nesting() { --p_->depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser* p_;
  };

  Body parse_template() {
    std::string end_tag;
    Body body = parse_body({}, &end_tag);
    return body;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& advance() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().kind == Tok::kOp && peek().text == op; }
  bool at_name(const char* name) const { return peek().kind == Tok::kName && peek().text == name; }
  void expect_op(const char* op) {
    if (!at_op(op)) {
      fail(fmt::format("line {}: expected '{}' but found '{}'", peek().line, op, describe(peek())));
    }
    ++i_;
  }
  void expect_block_end() {
    if (peek().kind != Tok::kBlockEnd) {
      fail(fmt::format("line {}: expected end of statement '%}}' but found '{}'", peek().line,
                       describe(peek())));
    }
    ++i_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::kName) {
      fail(fmt::format("line {}: expected a name but found '{}'", peek().line, describe(peek())));
    }
    return advance().text;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEof:
        return "end of template";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kBlockEnd:
        return "%}";
      default:
        return t.text;
    }
  }

  // Parses statements until a block tag whose name is in `ends`; leaves that name in *end_tag
  // and the position right after the tag name.
  Body parse_body(const std::vector<std::string>& ends, std::string* end_tag) {
    Nesting nesting(this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::kEof) {
        if (!ends.empty()) {
          fail(fmt::format("line {}: unexpected end of template, expected '{{% {} %}}'", t.line,
                           ends.front()));
        }
        return body;
      }
      if (t.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->text = advance().text;
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind == Tok::kVarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        s->expr = parse_expr();
        if (peek().kind != Tok::kVarEnd) {
          fail(fmt::format("line {}: expected '}}}}' but found '{}'", peek().line,
                           describe(peek())));
        }
        advance();
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind != Tok::kBlockBegin) fail(fmt::format("line {}: unexpected token", t.line));
      advance();
      const int line = peek().line;
      const std::string name = expect_name();
      if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
        *end_tag = name;
        return body;
      }
      if (name == "if") {
        body.push_back(parse_if(line));
      } else if (name == "for") {
        body.push_back(parse_for(line));
      } else if (name == "set") {
        body.push_back(parse_set(line));
      } else if (name == "break" || name == "continue") {
        if (loop_depth_ == 0) fail(fmt::format("line {}: '{}' outside of a loop", line, name));
        expect_block_end();
        auto s = std::make_unique<Stmt>();
        s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
        s->line = line;
        body.push_back(std::move(s));
      } else if (name == "generation") {
        // transformers' assistant-mask marker: renders its body unchanged.
        expect_block_end();
        std::string end;
        Body inner = parse_body({"endgeneration"}, &end);
        expect_block_end();
        for (auto& s : inner) body.push_back(std::move(s));
      } else if (name == "macro" || name == "call" || name == "include" || name == "import" ||
                 name == "from" || name == "extends" || name == "block" || name == "filter" ||
                 name == "raw" || name == "with" || name == "autoescape" || name == "do") {
        unsupported(fmt::format(
            "chat template uses '{{% {} %}}' at line {}, which is outside the supported Jinja "
            "subset",
            name, line));
      } else {
        fail(fmt::format("line {}: unknown or misplaced tag '{}'", line, name));
      }
    }
  }

  std::unique_ptr<Stmt> parse_if(int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kIf;
    s->line = line;
    ExprPtr cond = parse_expr();
    expect_block_end();
    while (true) {
      std::string end;
      Body b = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(std::move(cond), std::move(b));
      if (end == "endif") {
        expect_block_end();
        return s;
      }
      if (end == "else") {
        expect_block_end();
        Body eb = parse_body({"endif"}, &end);
        expect_block_end();
        s->branches.emplace_back(nullptr, std::move(eb));
        return s;
      }
      cond = parse_expr();  // elif
      expect_block_end();
    }
  }

  std::unique_ptr<Stmt> parse_for(int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFor;
    s->line = line;
    s->targets.push_back(expect_name());
    while (at_op(",")) {
      advance();
      s->targets.push_back(expect_name());
    }
    if (!at_name("in")) fail(fmt::format("line {}: expected 'in' in a for loop", line));
    advance();
    s->expr = parse_cond_free_expr();
    if (at_name("if")) {
      advance();
      s->filter = parse_cond_free_expr();
    }
    if (at_name("recursive")) {
      unsupported(
          fmt::format("chat template uses a recursive for loop at line {}, which is "
                      "outside the supported Jinja subset",
                      line));
    }
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end);
    --loop_depth_;
    expect_block_end();
    if (end == "else") {
      s->else_body = parse_body({"endfor"}, &end);
      expect_block_end();
    }
    return s;
  }

  std::unique_ptr<Stmt> parse_set(int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kSet;
    s->line = line;
    s->targets.push_back(expect_name());
    if (at_op(".")) {
      advance();
      s->attr = expect_name();
    } else {
      while (at_op(",")) {
        advance();
        s->targets.push_back(expect_name());
      }
    }
    if (peek().kind == Tok::kBlockEnd) {
      // {% set x %}...{% endset %}
      if (s->targets.size() != 1 || !s->attr.empty()) {
        fail(fmt::format("line {}: a block set takes one name", line));
      }
      advance();
      s->kind = StmtKind::kSetBlock;
      std::string end;
      s->body = parse_body({"endset"}, &end);
      expect_block_end();
      return s;
    }
    expect_op("=");
    s->expr = parse_tuple_or_expr();
    expect_block_end();
    return s;
  }

  // ---- expressions (Jinja2 precedence) ----
  // Makes `child` an operand of `parent`, keeping parent.depth (kMaxExprDepth bounds how deep
  // evaluation and destruction recurse; chains like a+b+c... deepen the tree without recursing
  // in the parser).
  static void attach(Expr& parent, ExprPtr child) {
    if (child) parent.depth = std::max(parent.depth, child->depth + 1);  // a slice part may be null
    if (parent.depth > kMaxExprDepth) {
      fail(fmt::format("line {}: an expression nests deeper than {} levels", parent.line,
                       kMaxExprDepth));
    }
    parent.args.push_back(std::move(child));
  }

  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  ExprPtr parse_tuple_or_expr() {
    ExprPtr first = parse_expr();
    if (!at_op(",")) return first;
    auto list = make(ExprKind::kList, first->line);
    attach(*list, std::move(first));
    while (at_op(",")) {
      advance();
      attach(*list, parse_expr());
    }
    return list;
  }

  ExprPtr parse_expr() {
    Nesting nesting(this);
    ExprPtr e = parse_or();
    while (at_name("if")) {
      const int line = advance().line;
      auto c = make(ExprKind::kCond, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (at_name("else")) {
        advance();
        other = parse_expr();
      }
      attach(*c, std::move(e));
      attach(*c, std::move(cond));
      if (other) attach(*c, std::move(other));
      e = std::move(c);
    }
    return e;
  }
  // For-loop iterables stop at a trailing `if` (the loop filter).
  ExprPtr parse_cond_free_expr() { return parse_or(); }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      auto o = make(ExprKind::kOr, advance().line);
      attach(*o, std::move(e));
      attach(*o, parse_and());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      auto o = make(ExprKind::kAnd, advance().line);
      attach(*o, std::move(e));
      attach(*o, parse_not());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (at_name("not")) {
      Nesting nesting(this);
      auto n = make(ExprKind::kNot, advance().line);
      attach(*n, parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().kind == Tok::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = advance().text;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek(1).kind == Tok::kName && peek(1).text == "in") {
        advance();
        advance();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, e->line);
        attach(*cmp, std::move(e));
      }
      cmp->ops.push_back(op);
      attach(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) {
    auto b = make(ExprKind::kBinary, l->line);
    b->name = std::move(op);
    attach(*b, std::move(l));
    attach(*b, std::move(r));
    return b;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (at_op("+") || at_op("-")) {
      std::string op = advance().text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (at_op("~")) {
      advance();
      e = binary("~", std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = advance().text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (at_op("**")) {
      advance();
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      Nesting nesting(this);
      const Token& t = advance();
      e = make(t.text == "-" ? ExprKind::kNeg : ExprKind::kPos, t.line);
      attach(*e, parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_and_test(std::move(e));
    return e;
  }

  void parse_call_args(Expr* call) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == Tok::kName && peek(1).kind == Tok::kOp && peek(1).text == "=") {
        std::string key = advance().text;
        advance();
        ExprPtr value = parse_expr();
        call->depth = std::max(call->depth, value->depth + 1);
        if (call->depth > kMaxExprDepth) {
          fail(fmt::format("line {}: an expression nests deeper than {} levels", call->line,
                           kMaxExprDepth));
        }
        call->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        attach(*call, parse_expr());
      }
      if (!at_op(",")) break;
      advance();
    }
    expect_op(")");
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    if (t.kind == Tok::kString) {
      auto e = make(ExprKind::kLiteral, t.line);
      std::string s = advance().text;
      while (peek().kind == Tok::kString) s += advance().text;  // implicit concatenation
      e->literal = Value(std::move(s));
      return e;
    }
    if (t.kind == Tok::kInt || t.kind == Tok::kFloat) {
      auto e = make(ExprKind::kLiteral, t.line);
      const std::string text = advance().text;
      if (t.kind == Tok::kInt) {
        e->literal = Value(int_literal(text, t.line));
      } else {
        e->literal = Value(std::strtod(text.c_str(), nullptr));  // inf when out of range
      }
      return e;
    }
    if (t.kind == Tok::kName) {
      const std::string name = advance().text;
      auto e = make(ExprKind::kLiteral, t.line);
      if (name == "true" || name == "True") {
        e->literal = Value(true);
      } else if (name == "false" || name == "False") {
        e->literal = Value(false);
      } else if (name == "none" || name == "None") {
        e->literal = Value(None{});
      } else {
        e->kind = ExprKind::kName;
        e->name = name;
      }
      return e;
    }
    if (at_op("(")) {
      const int line = advance().line;
      if (at_op(")")) {
        advance();
        auto e = make(ExprKind::kList, line);
        return e;
      }
      ExprPtr first = parse_expr();
      if (at_op(",")) {
        auto list = make(ExprKind::kList, line);
        attach(*list, std::move(first));
        while (at_op(",")) {
          advance();
          if (at_op(")")) break;
          attach(*list, parse_expr());
        }
        expect_op(")");
        return list;
      }
      expect_op(")");
      return first;
    }
    if (at_op("[")) {
      auto list = make(ExprKind::kList, advance().line);
      while (!at_op("]")) {
        attach(*list, parse_expr());
        if (!at_op(",")) break;
        advance();
      }
      expect_op("]");
      return list;
    }
    if (at_op("{")) {
      auto dict = make(ExprKind::kDict, advance().line);
      while (!at_op("}")) {
        ExprPtr key = parse_expr();
        expect_op(":");
        attach(*dict, std::move(key));
        attach(*dict, parse_expr());
        if (!at_op(",")) break;
        advance();
      }
      expect_op("}");
      return dict;
    }
    fail(fmt::format("line {}: unexpected '{}' in an expression", t.line, describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        const int line = advance().line;
        auto a = make(ExprKind::kAttr, line);
        if (peek().kind == Tok::kInt) {
          a->kind = ExprKind::kItem;
          auto idx = make(ExprKind::kLiteral, line);
          idx->literal = Value(int_literal(advance().text, line));
          attach(*a, std::move(e));
          attach(*a, std::move(idx));
        } else {
          a->name = expect_name();
          attach(*a, std::move(e));
        }
        e = std::move(a);
      } else if (at_op("[")) {
        const int line = advance().line;
        ExprPtr parts[3];
        int n_colons = 0;
        while (!at_op("]")) {
          if (at_op(":")) {
            advance();
            if (++n_colons > 2) fail(fmt::format("line {}: invalid slice", line));
            continue;
          }
          if (parts[n_colons]) fail(fmt::format("line {}: invalid subscript", line));
          parts[n_colons] = parse_expr();
        }
        expect_op("]");
        if (n_colons == 0) {
          if (!parts[0]) fail(fmt::format("line {}: empty subscript", line));
          auto item = make(ExprKind::kItem, line);
          attach(*item, std::move(e));
          attach(*item, std::move(parts[0]));
          e = std::move(item);
        } else {
          auto slice = make(ExprKind::kSlice, line);
          attach(*slice, std::move(e));
          for (auto& p : parts) attach(*slice, std::move(p));
          e = std::move(slice);
        }
      } else if (at_op("(")) {
        auto call = make(ExprKind::kCall, peek().line);
        attach(*call, std::move(e));
        parse_call_args(call.get());
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_and_test(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        const int line = advance().line;
        auto f = make(ExprKind::kFilter, line);
        f->name = expect_name();
        attach(*f, std::move(e));
        if (at_op("(")) parse_call_args(f.get());
        e = parse_postfix(std::move(f));
      } else if (at_name("is")) {
        const int line = advance().line;
        auto t = make(ExprKind::kTest, line);
        if (at_name("not")) {
          advance();
          t->negated = true;
        }
        t->name = expect_name();
        if (t->name == "none" || t->name == "true" || t->name == "false") {
          // keep as test names
        }
        attach(*t, std::move(e));
        if (at_op("(")) {
          parse_call_args(t.get());
        } else if (peek().kind == Tok::kString || peek().kind == Tok::kInt ||
                   peek().kind == Tok::kFloat ||
                   (peek().kind == Tok::kName &&
                    (peek().text == "none" || peek().text == "None" || peek().text == "true" ||
                     peek().text == "True" || peek().text == "false" || peek().text == "False"))) {
          attach(*t, parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;  // parse recursion levels open (Nesting)
  int loop_depth_ = 0;
};

// ================================================================================================
// Interpreter
// ================================================================================================
struct BreakSignal {};
struct ContinueSignal {};

class Interpreter {
 public:
  explicit Interpreter(const nlohmann::ordered_json& context) {
    frames_.emplace_back();
    install_globals();
    if (context.is_object()) {
      for (auto it = context.begin(); it != context.end(); ++it) {
        frames_.back()[it.key()] = from_json(*it);
      }
    }
  }

  void render(const Body& body, std::string& out) {
    for (const auto& s : body) exec(*s, out);
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  int64_t n_steps_ = 0;  // step()

  void install_globals() {
    Frame& g = frames_.back();
    g["raise_exception"] =
        make_callable("raise_exception", [](std::vector<Value>& a, KwArgs&) -> Value {
          fail(a.empty() ? std::string("raise_exception called") : to_str(a[0]));
        });
    g["namespace"] = make_callable("namespace", [](std::vector<Value>& a, KwArgs& kw) -> Value {
      auto d = std::make_shared<Dict>();
      d->is_namespace = true;
      for (auto& x : a) {
        if (x.is_dict()) {
          for (auto& [k, v] : x.dict().items) d->set(k, v);
        }
      }
      for (auto& [k, v] : kw) d->set(k, v);
      return Value(d);
    });
    g["dict"] = make_callable("dict", [](std::vector<Value>& a, KwArgs& kw) -> Value {
      auto d = std::make_shared<Dict>();
      for (auto& x : a) {
        if (x.is_dict()) {
          for (auto& [k, v] : x.dict().items) d->set(k, v);
        }
      }
      for (auto& [k, v] : kw) d->set(k, v);
      return Value(d);
    });
    g["range"] = make_callable("range", [](std::vector<Value>& a, KwArgs&) -> Value {
      int64_t start = 0, stop = 0, step = 1;
      for (auto& x : a) {
        if (!x.is_int()) fail("range() arguments must be integers");
      }
      if (a.size() == 1) {
        stop = a[0].as_int();
      } else if (a.size() >= 2) {
        start = a[0].as_int();
        stop = a[1].as_int();
        if (a.size() >= 3) step = a[2].as_int();
      } else {
        fail("range expected at least 1 argument");
      }
      if (step == 0) fail("range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        out.emplace_back(i);
        if (out.size() > 100000) fail("range() too large for a chat template");
        if (__builtin_add_overflow(i, step, &i)) break;  // past int64: past stop as well
      }
      return out;
    });
    g["strftime_now"] = make_callable("strftime_now", [](std::vector<Value>& a, KwArgs&) -> Value {
      if (a.empty() || !a[0].is_string()) fail("strftime_now expects a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), a[0].str().c_str(), &tm);
      return std::string(buf, n);
    });
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Undefined{name};
  }

  // ---- statements ----
  // Counts one statement or expression evaluated against kMaxRenderSteps.
  void step(int line) {
    if (++n_steps_ > kMaxRenderSteps) {
      fail(fmt::format("line {}: the template runs more than {} steps", line, kMaxRenderSteps));
    }
  }

  void exec(const Stmt& s, std::string& out) {
    step(s.line);
    if (out.size() > kMaxValueBytes) {
      fail(fmt::format("line {}: the rendered prompt exceeds {} bytes", s.line, kMaxValueBytes));
    }
    switch (s.kind) {
      case StmtKind::kText:
        out += s.text;
        return;
      case StmtKind::kPrint:
        out += to_str(eval(*s.expr));
        return;
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (!cond || truthy(eval(*cond))) {
            render(body, out);
            return;
          }
        }
        return;
      case StmtKind::kFor:
        exec_for(s, out);
        return;
      case StmtKind::kSet: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value target = lookup(s.targets[0]);
          if (!target.is_dict() || !target.dict().is_namespace) {
            fail(fmt::format("line {}: cannot assign attribute on non-namespace object '{}'",
                             s.line, s.targets[0]));
          }
          target.dict().set(s.attr, std::move(v));
        } else {
          assign(s.targets, std::move(v), s.line);
        }
        return;
      }
      case StmtKind::kSetBlock: {
        std::string captured;
        render(s.body, captured);
        frames_.back()[s.targets[0]] = Value(std::move(captured));
        return;
      }
      case StmtKind::kBreak:
        throw BreakSignal{};
      case StmtKind::kContinue:
        throw ContinueSignal{};
    }
  }

  void assign(const std::vector<std::string>& targets, Value v, int line) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = std::move(v);
      return;
    }
    List items = iterate(v);
    if (items.size() != targets.size()) {
      fail(fmt::format("line {}: cannot unpack {} values into {} names", line, items.size(),
                       targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = items[i];
  }

  void exec_for(const Stmt& s, std::string& out) {
    const Value iterable = eval(*s.expr);
    if (iterable.is_none()) fail(fmt::format("line {}: 'NoneType' object is not iterable", s.line));
    List items = iterate(iterable);
    frames_.emplace_back();
    if (s.filter) {
      List kept;
      for (auto& item : items) {
        assign(s.targets, item, s.line);
        if (truthy(eval(*s.filter))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const size_t n = items.size();
    auto loop = std::make_shared<Dict>();
    loop->is_loop = true;
    for (size_t i = 0; i < n; ++i) {
      step(s.line);  // an empty body still costs its iterations
      loop->items.clear();
      loop->items.emplace_back("index", Value(static_cast<int64_t>(i + 1)));
      loop->items.emplace_back("index0", Value(static_cast<int64_t>(i)));
      loop->items.emplace_back("revindex", Value(static_cast<int64_t>(n - i)));
      loop->items.emplace_back("revindex0", Value(static_cast<int64_t>(n - i - 1)));
      loop->items.emplace_back("first", Value(i == 0));
      loop->items.emplace_back("last", Value(i + 1 == n));
      loop->items.emplace_back("length", Value(static_cast<int64_t>(n)));
      loop->items.emplace_back("previtem", i > 0 ? items[i - 1] : Value(Undefined{"previtem"}));
      loop->items.emplace_back("nextitem", i + 1 < n ? items[i + 1] : Value(Undefined{"nextitem"}));
      assign(s.targets, items[i], s.line);
      frames_.back()["loop"] = Value(loop);
      try {
        render(s.body, out);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
    frames_.pop_back();
    if (n == 0) render(s.else_body, out);
  }

  // ---- expressions ----
  Value eval(const Expr& e) {
    step(e.line);
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return lookup(e.name);
      case ExprKind::kList: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return l;
      }
      case ExprKind::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(fmt::format("line {}: dict keys must be strings here", e.line));
          d->set(k.str(), eval(*e.args[i + 1]));
        }
        return Value(d);
      }
      case ExprKind::kAttr:
        return get_attr(eval(*e.args[0]), e.name, e.line);
      case ExprKind::kItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case ExprKind::kSlice:
        return slice(e);
      case ExprKind::kCall: {
        Value f = eval(*e.args[0]);
        if (!f.is_callable()) {
          fail(fmt::format("line {}: '{}' object is not callable", e.line, type_name(f)));
        }
        std::vector<Value> args;
        for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i]));
        KwArgs kw;
        for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v));
        return f.callable().fn(args, kw);
      }
      case ExprKind::kFilter:
        return apply_filter(e);
      case ExprKind::kTest: {
        const bool r = apply_test(e);
        return Value(e.negated ? !r : r);
      }
      case ExprKind::kNot:
        return Value(!truthy(eval(*e.args[0])));
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        Value v = eval(*e.args[0]);
        if (!v.is_number()) {
          fail(fmt::format("line {}: bad operand type for unary {}: '{}'", e.line,
                           e.kind == ExprKind::kNeg ? '-' : '+', type_name(v)));
        }
        if (e.kind == ExprKind::kPos) return v;
        if (v.is_float()) return Value(-v.as_double());
        return Value(sub_checked(0, v.as_int(), e.line));
      }
      case ExprKind::kBinary:
        return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case ExprKind::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==") {
            r = equals(left, right);
          } else if (op == "!=") {
            r = !equals(left, right);
          } else if (op == "in") {
            r = contains(right, left);
          } else if (op == "notin") {
            r = !contains(right, left);
          } else {
            const int c = compare(left, right, op.c_str());
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::kAnd: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? eval(*e.args[1]) : l;
      }
      case ExprKind::kOr: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? l : eval(*e.args[1]);
      }
      case ExprKind::kCond: {
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        if (e.args.size() > 2) return eval(*e.args[2]);
        return Undefined{"conditional expression"};
      }
    }
    return Undefined{};
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return Value(to_str(a) + to_str(b));
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return l;
      }
    }
    if (op == "*") {
      const Value* s = a.is_string() || a.is_list()     ? &a
                       : (b.is_string() || b.is_list()) ? &b
                                                        : nullptr;
      const Value* n = s == &a ? &b : &a;
      if (s && n->is_int()) {
        const int64_t times = std::max<int64_t>(0, n->as_int());
        const size_t unit = s->is_string() ? s->str().size() : s->list().size() * sizeof(Value);
        if (unit > 0 && static_cast<uint64_t>(times) > kMaxValueBytes / unit) {
          fail(
              fmt::format("line {}: repetition result larger than {} bytes", line, kMaxValueBytes));
        }
        if (s->is_string()) {
          std::string out;
          for (int64_t i = 0; i < times; ++i) out += s->str();
          return out;
        }
        List out;
        for (int64_t i = 0; i < times; ++i)
          out.insert(out.end(), s->list().begin(), s->list().end());
        return out;
      }
    }
    if (op == "%" && a.is_string()) {
      unsupported(
          fmt::format("chat template uses printf-style string formatting at line {}, "
                      "which is outside the supported Jinja subset",
                      line));
    }
    if (!a.is_number() || !b.is_number()) {
      fail(fmt::format("line {}: unsupported operand type(s) for {}: '{}' and '{}'", line, op,
                       type_name(a), type_name(b)));
    }
    const bool use_float = a.is_float() || b.is_float();
    if (op == "/") {
      if (b.as_double() == 0.0) fail(fmt::format("line {}: division by zero", line));
      return Value(a.as_double() / b.as_double());
    }
    if (op == "**") {
      if (!use_float && b.as_int() >= 0) {
        // Square and multiply: at most 64 rounds, each checked for overflow.
        int64_t r = 1, base = a.as_int(), exp = b.as_int();
        while (exp > 0) {
          if (exp & 1) r = mul_checked(r, base, line);
          exp >>= 1;
          if (exp > 0) base = mul_checked(base, base, line);
        }
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    if (use_float) {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0.0) fail(fmt::format("line {}: division by zero", line));
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
    } else {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(add_checked(x, y, line));
      if (op == "-") return Value(sub_checked(x, y, line));
      if (op == "*") return Value(mul_checked(x, y, line));
      if (y == 0) fail(fmt::format("line {}: integer division or modulo by zero", line));
      if (x == std::numeric_limits<int64_t>::min() && y == -1) integer_overflow(line);
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      if (op == "//") return Value(q);
      if (op == "%") return Value(m);
    }
    fail(fmt::format("line {}: unsupported operator {}", line, op));
  }

  static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + static_cast<int64_t>(n) : i; }

  Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_list() || obj.is_string()) {
      if (!key.is_int()) {
        if (key.is_string()) return get_attr(obj, key.str(), line);
        fail(fmt::format("line {}: indices must be integers, not {}", line, type_name(key)));
      }
      if (obj.is_list()) {
        const List& l = obj.list();
        const int64_t i = norm_index(key.as_int(), l.size());
        if (i < 0 || i >= static_cast<int64_t>(l.size())) return Undefined{"list index"};
        return l[static_cast<size_t>(i)];
      }
      const auto cps = code_points(obj.str());
      const int64_t i = norm_index(key.as_int(), cps.size());
      if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Undefined{"string index"};
      return std::string(cps[static_cast<size_t>(i)]);
    }
    if (obj.is_dict()) {
      if (key.is_string()) {
        if (const Value* v = obj.dict().find(key.str())) return *v;
        return get_attr(obj, key.str(), line);
      }
      return Undefined{"key"};
    }
    if (obj.is_undefined()) {
      fail(fmt::format("line {}: '{}' is undefined", line, std::get<Undefined>(obj.v).name));
    }
    return Undefined{"item"};
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    auto opt = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      Value v = eval(*e.args[k]);
      if (v.is_none()) return std::nullopt;
      if (!v.is_int()) fail(fmt::format("line {}: slice indices must be integers", e.line));
      return v.as_int();
    };
    const auto start = opt(1), stop = opt(2), step_opt = opt(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) fail(fmt::format("line {}: slice step cannot be zero", e.line));
    auto pick = [&](size_t n) {
      std::vector<size_t> idx;
      const auto sn = static_cast<int64_t>(n);
      auto clamp = [&](std::optional<int64_t> v, int64_t dflt, bool is_start) {
        if (!v) return dflt;
        int64_t x = *v < 0 ? *v + sn : *v;
        if (step > 0) return std::clamp<int64_t>(x, 0, sn);
        (void)is_start;
        return std::clamp<int64_t>(x, -1, sn - 1);
      };
      if (step > 0) {
        for (int64_t i = clamp(start, 0, true); i < clamp(stop, sn, false); i += step) {
          idx.push_back(static_cast<size_t>(i));
        }
      } else {
        for (int64_t i = clamp(start, sn - 1, true); i > clamp(stop, -1, false); i += step) {
          idx.push_back(static_cast<size_t>(i));
        }
      }
      return idx;
    };
    if (obj.is_list()) {
      List out;
      for (size_t i : pick(obj.list().size())) out.push_back(obj.list()[i]);
      return out;
    }
    if (obj.is_string()) {
      const auto cps = code_points(obj.str());
      std::string out;
      for (size_t i : pick(cps.size())) out += cps[i];
      return out;
    }
    fail(fmt::format("line {}: '{}' object is not subscriptable", e.line, type_name(obj)));
  }

  Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) {
      fail(fmt::format("line {}: '{}' is undefined", line, std::get<Undefined>(obj.v).name));
    }
    if (obj.is_dict()) {
      if (!obj.dict().is_namespace && !obj.dict().is_loop) {
        if (Value m = dict_method(obj, name); !m.is_undefined()) return m;
      }
      if (const Value* v = obj.dict().find(name)) return *v;
      if (obj.dict().is_loop && name == "cycle") {
        unsupported(
            fmt::format("chat template uses loop.cycle at line {}, which is outside the "
                        "supported Jinja subset",
                        line));
      }
      return Undefined{name};
    }
    if (obj.is_string()) return string_method(obj, name);
    return Undefined{name};
  }

  static std::optional<std::string> opt_chars(const std::vector<Value>& a) {
    if (a.empty() || a[0].is_none()) return std::nullopt;
    if (!a[0].is_string()) fail("strip arg must be None or str");
    return a[0].str();
  }

  Value dict_method(const Value& obj, const std::string& name) {
    auto d = std::get<std::shared_ptr<Dict>>(obj.v);
    if (name == "items") {
      return make_callable("items", [d](std::vector<Value>&, KwArgs&) -> Value {
        List out;
        for (auto& [k, v] : d->items) out.emplace_back(List{Value(k), v});
        return out;
      });
    }
    if (name == "keys") {
      return make_callable("keys", [d](std::vector<Value>&, KwArgs&) -> Value {
        List out;
        for (auto& [k, v] : d->items) out.emplace_back(k);
        return out;
      });
    }
    if (name == "values") {
      return make_callable("values", [d](std::vector<Value>&, KwArgs&) -> Value {
        List out;
        for (auto& [k, v] : d->items) out.push_back(v);
        return out;
      });
    }
    if (name == "get") {
      return make_callable("get", [d](std::vector<Value>& a, KwArgs&) -> Value {
        if (a.empty()) fail("get expected at least 1 argument");
        if (a[0].is_string()) {
          if (const Value* v = d->find(a[0].str())) return *v;
        }
        return a.size() > 1 ? a[1] : Value(None{});
      });
    }
    return Undefined{name};
  }

  Value string_method(const Value& obj, const std::string& name) {
    const std::string s = obj.str();
    using Fn = std::function<Value(std::vector<Value>&, KwArgs&)>;
    Fn fn;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      fn = [s, l, r](std::vector<Value>& a, KwArgs&) -> Value {
        return py_strip(s, l, r, opt_chars(a));
      };
    } else if (name == "split") {
      fn = [s](std::vector<Value>& a, KwArgs& kw) -> Value {
        Value sep = a.size() > 0 ? a[0] : Value(None{});
        int64_t maxsplit = a.size() > 1 && a[1].is_int() ? a[1].as_int() : -1;
        for (auto& [k, v] : kw) {
          if (k == "sep") sep = v;
          if (k == "maxsplit" && v.is_int()) maxsplit = v.as_int();
        }
        return py_split(s, sep, maxsplit);
      };
    } else if (name == "startswith" || name == "endswith") {
      const bool start = name == "startswith";
      fn = [s, start](std::vector<Value>& a, KwArgs&) -> Value {
        if (a.empty()) fail("startswith/endswith expects an argument");
        List candidates = a[0].is_list() ? a[0].list() : List{a[0]};
        for (auto& c : candidates) {
          if (!c.is_string()) fail("startswith/endswith first arg must be str or a tuple of str");
          const std::string& p = c.str();
          if (p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                             : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
            return Value(true);
          }
        }
        return Value(false);
      };
    } else if (name == "upper" || name == "lower") {
      const bool up = name == "upper";
      fn = [s, up](std::vector<Value>&, KwArgs&) -> Value { return map_case(s, up); };
    } else if (name == "title") {
      fn = [s](std::vector<Value>&, KwArgs&) -> Value { return title_case(s); };
    } else if (name == "capitalize") {
      fn = [s](std::vector<Value>&, KwArgs&) -> Value { return capitalize(s); };
    } else if (name == "replace") {
      fn = [s](std::vector<Value>& a, KwArgs&) -> Value {
        if (a.size() < 2 || !a[0].is_string() || !a[1].is_string())
          fail("replace expects two strings");
        return replace_all(s, a[0].str(), a[1].str(),
                           a.size() > 2 && a[2].is_int() ? a[2].as_int() : -1);
      };
    } else if (name == "find" || name == "count") {
      const bool find = name == "find";
      fn = [s, find](std::vector<Value>& a, KwArgs&) -> Value {
        if (a.empty() || !a[0].is_string()) fail("find/count expects a string");
        const std::string& p = a[0].str();
        if (find) {
          const size_t pos = s.find(p);
          if (pos == std::string::npos) return Value(static_cast<int64_t>(-1));
          return Value(static_cast<int64_t>(code_points(s.substr(0, pos)).size()));
        }
        if (p.empty()) return Value(static_cast<int64_t>(code_points(s).size() + 1));
        int64_t n = 0;
        for (size_t pos = s.find(p); pos != std::string::npos; pos = s.find(p, pos + p.size())) ++n;
        return Value(n);
      };
    } else if (name == "join") {
      fn = [s](std::vector<Value>& a, KwArgs&) -> Value {
        if (a.empty()) fail("join expects an iterable");
        std::string out;
        bool first = true;
        for (auto& x : iterate(a[0])) {
          if (!x.is_string()) fail("sequence item: expected str instance");
          if (!first) out += s;
          first = false;
          out += x.str();
        }
        return out;
      };
    } else if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" ||
               name == "islower") {
      const std::string which = name;
      fn = [s, which](std::vector<Value>&, KwArgs&) -> Value {
        if (s.empty()) return Value(false);
        bool any_cased = false;
        for (auto cpv : code_points(s)) {
          const char32_t cp = decode_cp(cpv);
          if (which == "isdigit" && !(cp >= '0' && cp <= '9')) return Value(false);
          if (which == "isspace" && !utf8::is_python_space(cp)) return Value(false);
          if (which == "isalpha" && !is_alpha_cp(cp)) return Value(false);
          if (which == "isupper" || which == "islower") {
            const std::string c(cpv);
            const bool up = map_case(c, true) == c, low = map_case(c, false) == c;
            if (up != low) {
              any_cased = true;
              if (which == "isupper" && !up) return Value(false);
              if (which == "islower" && !low) return Value(false);
            }
          }
        }
        return Value(which == "isupper" || which == "islower" ? any_cased : true);
      };
    } else {
      return Undefined{name};
    }
    return make_callable(name, std::move(fn));
  }

  // ---- filters ----
  Value arg_or(const std::vector<Value>& a, const KwArgs& kw, size_t i, const char* key,
               Value dflt) {
    for (const auto& [k, v] : kw) {
      if (k == key) return v;
    }
    return i < a.size() ? a[i] : dflt;
  }

  Value attribute_of(const Value& item, const std::string& path, int line) {
    Value cur = item;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (cur.is_undefined()) return cur;
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      cur = numeric ? get_item(cur, Value(int_literal(part, line)), line)
                    : get_item(cur, Value(part), line);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value apply_filter(const Expr& e) {
    Value v = eval(*e.args[0]);
    std::vector<Value> a;
    for (size_t i = 1; i < e.args.size(); ++i) a.push_back(eval(*e.args[i]));
    KwArgs kw;
    for (const auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
    return filter(e.name, v, a, kw, e.line);
  }

  Value filter(const std::string& name, const Value& v, std::vector<Value>& a, KwArgs& kw,
               int line) {
    if (name == "trim") {
      Value chars = arg_or(a, kw, 0, "chars", None{});
      return py_strip(to_str(v), true, true,
                      chars.is_string() ? std::optional<std::string>(chars.str()) : std::nullopt);
    }
    if (name == "length" || name == "count") {
      if (v.is_string()) return Value(static_cast<int64_t>(code_points(v.str()).size()));
      if (v.is_list()) return Value(static_cast<int64_t>(v.list().size()));
      if (v.is_dict()) return Value(static_cast<int64_t>(v.dict().items.size()));
      if (v.is_undefined()) return Value(static_cast<int64_t>(0));
      fail(fmt::format("line {}: object of type '{}' has no len()", line, type_name(v)));
    }
    if (name == "tojson") {
      Value indent = arg_or(a, kw, 0, "indent", None{});
      Value sort_keys = arg_or(a, kw, 99, "sort_keys", Value(false));
      Value separators = arg_or(a, kw, 99, "separators", None{});
      const int ind = indent.is_int() ? static_cast<int>(indent.as_int()) : -1;
      std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
      if (separators.is_list() && separators.list().size() == 2 &&
          separators.list()[0].is_string() && separators.list()[1].is_string()) {
        item_sep = separators.list()[0].str();
        key_sep = separators.list()[1].str();
      }
      std::string out;
      to_json(out, v, ind, 0, item_sep, key_sep, truthy(sort_keys));
      return out;
    }
    if (name == "upper" || name == "lower") return map_case(to_str(v), name == "upper");
    if (name == "title") return title_case(to_str(v));
    if (name == "capitalize") return capitalize(to_str(v));
    if (name == "string") return to_str(v);
    if (name == "safe" || name == "e" || name == "escape") {
      if (name != "safe") {
        unsupported(
            fmt::format("chat template uses the '{}' filter at line {}, which is outside "
                        "the supported Jinja subset",
                        name, line));
      }
      return v;
    }
    if (name == "default" || name == "d") {
      Value dflt = arg_or(a, kw, 0, "default_value", Value(std::string()));
      const bool boolean = truthy(arg_or(a, kw, 1, "boolean", Value(false)));
      if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
      return v;
    }
    if (name == "join") {
      Value sep = arg_or(a, kw, 0, "d", Value(std::string()));
      Value attr = arg_or(a, kw, 1, "attribute", None{});
      std::string out;
      bool first = true;
      for (auto& x : iterate(v)) {
        if (!first) out += to_str(sep);
        first = false;
        out += to_str(attr.is_string() ? attribute_of(x, attr.str(), line) : x);
      }
      return out;
    }
    if (name == "first" || name == "last") {
      List items = iterate(v);
      if (items.empty()) return Undefined{name};
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return iterate(v);
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.str());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return out;
      }
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      return items;
    }
    if (name == "int") {
      if (v.is_int()) return Value(v.as_int());
      if (v.is_float()) {
        const double d = std::trunc(v.as_double());
        // Inside int64's range (2^63 is exact in a double); NaN fails both comparisons.
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
          fail(fmt::format("line {}: cannot convert {} to an integer", line, float_repr(d)));
        }
        return Value(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        try {
          return Value(static_cast<int64_t>(std::stoll(v.str())));
        } catch (const std::exception&) {
        }
      }
      return arg_or(a, kw, 0, "default", Value(static_cast<int64_t>(0)));
    }
    if (name == "float") {
      if (v.is_number()) return Value(v.as_double());
      if (v.is_string()) {
        try {
          return Value(std::stod(v.str()));
        } catch (const std::exception&) {
        }
      }
      return arg_or(a, kw, 0, "default", Value(0.0));
    }
    if (name == "abs") {
      if (v.is_float()) return Value(std::fabs(v.as_double()));
      if (v.is_int()) {
        if (v.as_int() == std::numeric_limits<int64_t>::min()) integer_overflow(line);
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      fail(fmt::format("line {}: bad operand type for abs()", line));
    }
    if (name == "round") {
      const int64_t precision =
          arg_or(a, kw, 0, "precision", Value(static_cast<int64_t>(0))).as_int();
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value(std::round(v.as_double() * scale) / scale);
    }
    if (name == "replace") {
      if (a.size() < 2) fail(fmt::format("line {}: replace expects two arguments", line));
      return replace_all(to_str(v), to_str(a[0]), to_str(a[1]),
                         a.size() > 2 && a[2].is_int() ? a[2].as_int() : -1);
    }
    if (name == "items") {
      if (!v.is_dict()) fail(fmt::format("line {}: items filter expects a mapping", line));
      List out;
      for (auto& [k, x] : v.dict().items) out.emplace_back(List{Value(k), x});
      return out;
    }
    if (name == "unique") {
      List out;
      for (auto& x : iterate(v)) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equals(x, y); }))
          out.push_back(x);
      }
      return out;
    }
    if (name == "min" || name == "max" || name == "sum") {
      List items = iterate(v);
      if (name == "sum") {
        Value total(static_cast<int64_t>(0));
        for (auto& x : items) total = binary("+", total, x, line);
        return total;
      }
      if (items.empty()) return Undefined{name};
      Value best = items[0];
      for (auto& x : items) {
        const int c = compare(x, best, name.c_str());
        if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
      }
      return best;
    }
    if (name == "map") {
      List out;
      Value attr = arg_or(a, kw, 99, "attribute", None{});
      if (attr.is_string()) {
        Value dflt = arg_or(a, kw, 99, "default", Undefined{});
        for (auto& x : iterate(v)) {
          Value r = attribute_of(x, attr.str(), line);
          out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
        }
        return out;
      }
      if (a.empty() || !a[0].is_string())
        fail(fmt::format("line {}: map expects a filter name or attribute=", line));
      const std::string fname = a[0].str();
      std::vector<Value> rest(a.begin() + 1, a.end());
      for (auto& x : iterate(v)) {
        std::vector<Value> args = rest;
        KwArgs kwargs;
        out.push_back(filter(fname, x, args, kwargs, line));
      }
      return out;
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.empty() || !a[0].is_string())
          fail(fmt::format("line {}: {} expects an attribute name", line, name));
        attr = a[0].str();
        k = 1;
      }
      std::string test;
      if (k < a.size()) {
        if (!a[k].is_string()) fail(fmt::format("line {}: {} expects a test name", line, name));
        test = a[k].str();
      }
      std::vector<Value> test_args(a.begin() + static_cast<long>(std::min(a.size(), k + 1)),
                                   a.end());
      List out;
      for (auto& x : iterate(v)) {
        Value subject = by_attr ? attribute_of(x, attr, line) : x;
        const bool r = test.empty() ? truthy(subject) : run_test(test, subject, test_args, line);
        if (r == keep_if) out.push_back(x);
      }
      return out;
    }
    unsupported(
        fmt::format("chat template uses the filter '{}' at line {}, which is outside the "
                    "supported Jinja subset",
                    name, line));
  }

  // ---- tests ----
  bool apply_test(const Expr& e) {
    const std::string& name = e.name;
    if (name == "defined" || name == "undefined") {
      Value v;
      try {
        v = eval(*e.args[0]);
      } catch (const TemplateError&) {
        throw;
      }
      return name == "defined" ? !v.is_undefined() : v.is_undefined();
    }
    Value v = eval(*e.args[0]);
    std::vector<Value> a;
    for (size_t i = 1; i < e.args.size(); ++i) a.push_back(eval(*e.args[i]));
    return run_test(name, v, a, e.line);
  }

  bool run_test(const std::string& name, const Value& v, const std::vector<Value>& a, int line) {
    auto arg = [&]() -> const Value& {
      if (a.empty()) fail(fmt::format("line {}: test '{}' expects an argument", line, name));
      return a[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number() && !v.is_bool();
    if (name == "integer") return v.is_int() && !v.is_bool();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && std::get<bool>(v.v);
    if (name == "false") return v.is_bool() && !std::get<bool>(v.v);
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
    if (name == "callable") return v.is_callable();
    if (name == "even" || name == "odd") {
      if (!v.is_int()) fail(fmt::format("line {}: test '{}' expects an integer", line, name));
      return (v.as_int() % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") {
      const Value& d = arg();
      if (!v.is_int() || !d.is_int() || d.as_int() == 0)
        fail(fmt::format("line {}: bad divisibleby", line));
      return v.as_int() % d.as_int() == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return equals(v, arg());
    if (name == "ne" || name == "!=") return !equals(v, arg());
    if (name == "sameas")
      return equals(v, arg()) && (v.is_none() || v.is_bool() || v.is_undefined());
    if (name == "lt" || name == "<") return compare(v, arg(), "<") < 0;
    if (name == "le" || name == "<=") return compare(v, arg(), "<=") <= 0;
    if (name == "gt" || name == ">") return compare(v, arg(), ">") > 0;
    if (name == "ge" || name == ">=") return compare(v, arg(), ">=") >= 0;
    if (name == "in") return contains(arg(), v);
    if (name == "lower") return v.is_string() && map_case(v.str(), false) == v.str();
    if (name == "upper") return v.is_string() && map_case(v.str(), true) == v.str();
    unsupported(
        fmt::format("chat template uses the test '{}' at line {}, which is outside the "
                    "supported Jinja subset",
                    name, line));
  }

  std::vector<Frame> frames_;
};

}  // namespace

struct ChatTemplate::Program {
  Body body;
};

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  try {
    Lexer lexer(source);
    Parser parser(lexer.run());
    auto program = std::make_shared<Program>();
    program->body = parser.parse_template();
    return ChatTemplate(std::move(program));
  } catch (const TemplateError& e) {
    return Status(e.code, std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    // Anything else (a library's range error, memory) is the template's fault, not a crash.
    return Status(StatusCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  try {
    Interpreter interpreter(context);
    std::string out;
    interpreter.render(program_->body, out);
    return out;
  } catch (const TemplateError& e) {
    return Status(e.code, std::string("chat template: ") + e.what());
  } catch (const BreakSignal&) {
    return Status(StatusCode::kInternal, "chat template: break outside of a loop");
  } catch (const ContinueSignal&) {
    return Status(StatusCode::kInternal, "chat template: continue outside of a loop");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
}

}  // namespace litellama
