// ChatTemplate's API over the Jinja subset of jinja_*.h: parse once (lexer, parser), render per
// request (evaluator). Errors thrown inside become a Status here.
#include "services/tokenizer/chat_template.h"

#include <exception>

#include "services/tokenizer/jinja_evaluator.h"
#include "services/tokenizer/jinja_lexer.h"
#include "services/tokenizer/jinja_parser.h"
#include "services/tokenizer/jinja_value.h"

namespace litellama {

struct ChatTemplate::Program {
  jinja::Body body;
};

namespace {

// `X['content']` or `X.content`, under any chain of filters.
bool is_content(const jinja::Expr* e) {
  while (e != nullptr && e->kind == jinja::ExprKind::kFilter && !e->args.empty()) {
    e = e->args[0].get();
  }
  if (e == nullptr) return false;
  if (e->kind == jinja::ExprKind::kAttr) return e->name == "content";
  return e->kind == jinja::ExprKind::kItem && e->args.size() == 2 &&
         e->args[1]->kind == jinja::ExprKind::kLiteral && e->args[1]->literal.is_string() &&
         e->args[1]->literal.str() == "content";
}

bool loops_over_content(const jinja::Body& body) {
  for (const auto& stmt : body) {
    if (stmt->kind == jinja::StmtKind::kFor && is_content(stmt->expr.get())) return true;
    if (loops_over_content(stmt->body) || loops_over_content(stmt->else_body)) return true;
    for (const auto& [condition, branch] : stmt->branches) {
      if (loops_over_content(branch)) return true;
    }
  }
  return false;
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  try {
    auto program = std::make_shared<Program>();
    program->body = jinja::parse(jinja::tokenize(source));
    const bool parts = loops_over_content(program->body);
    ChatTemplate parsed(std::move(program));
    parsed.reads_content_parts_ = parts;
    return parsed;
  } catch (const jinja::TemplateError& e) {
    return Status(e.code, std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    // Anything else (a library's range error, memory) is the template's fault, not a crash.
    return Status(StatusCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  try {
    std::string out;
    jinja::render(program_->body, context, out);
    return out;
  } catch (const jinja::TemplateError& e) {
    return Status(e.code, std::string("chat template: ") + e.what());
  } catch (const std::exception& e) {
    return Status(StatusCode::kInvalidArgument, std::string("chat template: ") + e.what());
  }
}

}  // namespace litellama
