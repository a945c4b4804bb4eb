#include "services/tokenizer/jinja_parser.h"

#include <algorithm>

#include <fmt/format.h>

namespace litellama::jinja {
namespace {

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
        auto s = new_stmt(StmtKind::kPrint, t.line);
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
        auto s = new_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
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
    auto s = new_stmt(StmtKind::kIf, line);
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

  static std::unique_ptr<Stmt> new_stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // `(',' name)*` after a first name: for-loop and set targets.
  void parse_more_names(std::vector<std::string>* names) {
    while (at_op(",")) {
      advance();
      names->push_back(expect_name());
    }
  }

  std::unique_ptr<Stmt> parse_for(int line) {
    auto s = new_stmt(StmtKind::kFor, line);
    s->targets.push_back(expect_name());
    parse_more_names(&s->targets);
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
    auto s = new_stmt(StmtKind::kSet, line);
    s->targets.push_back(expect_name());
    if (at_op(".")) {
      advance();
      s->attr = expect_name();
    } else {
      parse_more_names(&s->targets);
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

  // `operand (keyword operand)*`, grouped to the left: a or b or c is (a or b) or c.
  ExprPtr parse_left_assoc(const char* keyword, ExprKind kind, ExprPtr (Parser::*operand)()) {
    ExprPtr e = (this->*operand)();
    while (at_name(keyword)) {
      auto o = make(kind, advance().line);
      attach(*o, std::move(e));
      attach(*o, (this->*operand)());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr parse_or() { return parse_left_assoc("or", ExprKind::kOr, &Parser::parse_and); }
  ExprPtr parse_and() { return parse_left_assoc("and", ExprKind::kAnd, &Parser::parse_not); }
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

}  // namespace

Body parse(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace litellama::jinja
