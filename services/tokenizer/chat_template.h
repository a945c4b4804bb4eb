// ChatTemplate: renders the Jinja `chat_template` of tokenizer_config.json.
//
// Why hand-written: there is no Debian-packaged C++ Jinja engine, and chat templates use a small,
// stable subset of Jinja2. This interpreter implements that subset with the same environment
// transformers uses (`trim_blocks=True`, `lstrip_blocks=True`, loop controls, a `tojson` that
// keeps non-ASCII text, `raise_exception`), so that the rendered prompt is byte-identical.
//
// Supported: text, {{ }}, {# #}, whitespace control (-/+), {% if/elif/else %}, {% for %} (with
// `loop.*`, `else`, an `if` filter and tuple unpacking), {% set %} (names, `ns.attr`, block set),
// {% break %}, {% continue %}, {% generation %}; literals (strings, numbers, lists, dicts,
// tuples), arithmetic, comparisons, `in`, `not`, `and`, `or`, `~`, conditional expressions,
// attribute/subscript/slice access, the tests and filters of Jinja2 that templates use (trim,
// length, tojson, join, map, select/selectattr, default, upper, ...), string methods (strip,
// split, startswith, ...), dict methods (items, keys, values, get) and the globals namespace(),
// range(), dict(), raise_exception() and strftime_now().
// Anything else (macro, call, include, import, extends, block, filter blocks, raw, ...) fails at
// parse time with an error that names the construct and its line: never a silently wrong prompt.
//
// Internally evaluation errors are thrown and caught at this API, which only returns Status.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

class ChatTemplate {
 public:
  // Parses `source`; fails with kUnsupported for a construct outside the subset above and with
  // kInvalidArgument for a syntax error.
  static Result<ChatTemplate> parse(const std::string& source);

  // Renders with the variables of `context` (a JSON object: messages, add_generation_prompt,
  // bos_token, ...). A `raise_exception(msg)` in the template returns kInvalidArgument with msg.
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  // Whether the template reads a message's content as a list of typed parts (OpenAI's format,
  // as multimodal templates such as llava-hf's do: `for c in message['content'] |
  // selectattr('type', 'equalto', 'image')`): some loop of it iterates `X['content']` or
  // `X.content`, through any filters. Such a template renders a plain string content as nothing,
  // so callers hand it parts (chat_context in tokenizer.h); the others get strings.
  bool reads_content_parts() const { return reads_content_parts_; }

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  struct Program;

 private:
  explicit ChatTemplate(std::shared_ptr<const Program> program);
  std::shared_ptr<const Program> program_;
  bool reads_content_parts_ = false;
};

}  // namespace litellama
