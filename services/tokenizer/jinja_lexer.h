// The chat template's lexer: text, {{ }} and {% %} tags (comments dropped) with Jinja's whitespace
// control and transformers' trim_blocks / lstrip_blocks, then the tokens inside tags.
#pragma once

#include <string>
#include <vector>

namespace litellama::jinja {

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

// Throws TemplateError (jinja_value.h) on an unterminated tag or string, or a bad character.
std::vector<Token> tokenize(std::string source);

}  // namespace litellama::jinja
