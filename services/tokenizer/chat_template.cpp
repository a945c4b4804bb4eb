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

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  try {
    auto program = std::make_shared<Program>();
    program->body = jinja::parse(jinja::tokenize(source));
    return ChatTemplate(std::move(program));
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
