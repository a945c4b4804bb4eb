#include "services/tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <utf8proc.h>

#include "services/tokenizer/utf8.h"

namespace litellama::jinja {

[[noreturn]] void fail(const std::string& message) {
  throw TemplateError(StatusCode::kInvalidArgument, message);
}
[[noreturn]] void unsupported(const std::string& message) {
  throw TemplateError(StatusCode::kUnsupported, message);
}

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

// Case mapping and letter classes from Unicode's character database (utf8proc): the simple,
// one-to-one mappings. Python's str.upper()/lower() also apply the few one-to-many special
// casings (e.g. "ß".upper() == "SS"); those characters map to themselves here.
std::string map_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (auto cpv : code_points(s)) {
    const auto cp = static_cast<utf8proc_int32_t>(decode_cp(cpv));
    utf8::append(out, static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
  }
  return out;
}

bool is_alpha_cp(char32_t cp) {
  return utf8::is_letter(cp);
}

namespace {

// Python's "cased" characters: upper-, lower- and titlecase letters.
bool is_cased_cp(char32_t cp) {
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

char32_t title_cp(char32_t cp) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}

}  // namespace

// str.title(): a character after a cased one is lowercased, any other is titlecased.
std::string title_case(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (auto cpv : code_points(s)) {
    const char32_t cp = decode_cp(cpv);
    const char32_t mapped =
        prev_cased ? static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)))
                   : title_cp(cp);
    utf8::append(out, mapped);
    prev_cased = is_cased_cp(cp);
  }
  return out;
}

// str.capitalize(): the first character titlecased, the rest lowercased.
std::string capitalize(const std::string& s) {
  const auto cps = code_points(s);
  if (cps.empty()) return s;
  std::string out;
  utf8::append(out, title_cp(decode_cp(cps[0])));
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

}  // namespace litellama::jinja
