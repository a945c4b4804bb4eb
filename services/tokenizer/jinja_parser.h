// The chat template's syntax tree and parser. Constructs outside the supported subset
// (chat_template.h) fail at parse time naming the construct and its line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "services/tokenizer/jinja_lexer.h"
#include "services/tokenizer/jinja_value.h"

namespace litellama::jinja {

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

// Throws TemplateError on a syntax error (kInvalidArgument) or an unsupported construct
// (kUnsupported).
Body parse(std::vector<Token> tokens);

}  // namespace litellama::jinja
