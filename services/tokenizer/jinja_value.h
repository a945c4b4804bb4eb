// The values a chat template sees (Python objects: None, bool, int, float, str, list, dict,
// callables, and Jinja's undefined) and the Python semantics the evaluator gives them:
// str()/repr(), json.dumps, comparisons, string methods. Internal to ChatTemplate
// (services/tokenizer/ chat_template.h); errors are thrown as TemplateError and become a Status at
// that API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama::jinja {

struct TemplateError : std::runtime_error {
  TemplateError(StatusCode c, const std::string& m) : std::runtime_error(m), code(c) {}
  StatusCode code;
};

[[noreturn]] void fail(const std::string& message);         // kInvalidArgument
[[noreturn]] void unsupported(const std::string& message);  // kUnsupported

// Limits that keep a hostile or broken template from exhausting the stack, the memory or the
// time of the tokenizer: real chat templates nest a few levels, build strings of kilobytes and
// run thousands of statements.
constexpr int kMaxNesting = 64;     // blocks, parentheses, `not`/sign chains (parse recursion)
constexpr int kMaxExprDepth = 256;  // expression tree depth (evaluation recursion)
constexpr size_t kMaxValueBytes = size_t{16} << 20;  // a repeated string or list
constexpr int64_t kMaxRenderSteps = 10'000'000;      // statements and expressions evaluated

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

Value make_callable(std::string name, std::function<Value(std::vector<Value>&, KwArgs&)> fn);

// Integer arithmetic as Python does it, except that a result outside int64 is an error; integer
// literals out of range are an error.
[[noreturn]] void integer_overflow(int line);
int64_t add_checked(int64_t x, int64_t y, int line);
int64_t sub_checked(int64_t x, int64_t y, int line);
int64_t mul_checked(int64_t x, int64_t y, int line);
int64_t int_literal(const std::string& text, int line);

// Python-like helpers of the evaluator.
const char* type_name(const Value& v);
bool truthy(const Value& v);
// UTF-8 code points (Python indexes strings by code point).
std::vector<std::string_view> code_points(std::string_view s);
char32_t decode_cp(std::string_view s);
// Python str() and repr().
std::string float_repr(double d);
std::string to_str(const Value& v);
std::string string_repr(const std::string& s);
std::string repr(const Value& v);
// json.dumps(ensure_ascii=False), as transformers' tojson filter.
void json_string(std::string& out, const std::string& s);
void to_json(std::string& out, const Value& v, int indent, int depth, const std::string& item_sep,
             const std::string& key_sep, bool sort_keys);
Value from_json(const nlohmann::ordered_json& j);
// Comparisons with Python semantics.
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b, const char* op);
bool contains(const Value& container, const Value& item);
List iterate(const Value& v);
// Python string methods.
bool in_chars(char32_t cp, const std::optional<std::string>& chars);
std::string py_strip(const std::string& s, bool left, bool right,
                     const std::optional<std::string>& chars);
std::string map_case(const std::string& s, bool upper);
bool is_alpha_cp(char32_t cp);
std::string title_case(const std::string& s);
std::string capitalize(const std::string& s);
List py_split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);

}  // namespace litellama::jinja
