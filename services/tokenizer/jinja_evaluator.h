// The chat template's evaluator: runs a parsed body with the variables of a JSON context and the
// globals transformers provides (raise_exception, namespace, range, dict, strftime_now).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "services/tokenizer/jinja_parser.h"

namespace litellama::jinja {

// Appends the rendering to `out`. Throws TemplateError on an evaluation error (raise_exception
// included, as kInvalidArgument).
void render(const Body& body, const nlohmann::ordered_json& context, std::string& out);

}  // namespace litellama::jinja
