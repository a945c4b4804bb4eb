#include "services/tokenizer/jinja_evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "services/tokenizer/utf8.h"

namespace litellama::jinja {
namespace {

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

void render(const Body& body, const nlohmann::ordered_json& context, std::string& out) {
  try {
    Interpreter interpreter(context);
    interpreter.render(body, out);
  } catch (const BreakSignal&) {
    throw TemplateError(StatusCode::kInternal, "break outside of a loop");
  } catch (const ContinueSignal&) {
    throw TemplateError(StatusCode::kInternal, "continue outside of a loop");
  }
}

}  // namespace litellama::jinja
