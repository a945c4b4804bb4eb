// Fuzz target: the chat-template interpreter (services/tokenizer/chat_template.h). The input is a
// template source; it is parsed and, when it parses, rendered with two contexts shaped like the
// ones the tokenizer passes (alternating roles with special tokens, and a conversation with a
// system turn, tools and non-ASCII text). Properties: parse and render return a value or an
// error, never crash, recurse without bound or run away (libFuzzer's -timeout and -rss_limit_mb
// catch those); rendering is deterministic.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "services/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const nlohmann::ordered_json& contexts(int i) {
  static const nlohmann::ordered_json kContexts[2] = {
      nlohmann::ordered_json::parse(R"J({
        "messages": [{"role": "user", "content": "Hello"},
                     {"role": "assistant", "content": "Hi there"},
                     {"role": "user", "content": "How are you?"}],
        "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
        "tools": null, "documents": null})J"),
      nlohmann::ordered_json::parse(R"J({
        "messages": [{"role": "system", "content": "Be brief. \u00e9\u65e5\u672c"},
                     {"role": "user", "content": "  spaced\n\ttext  "},
                     {"role": "assistant", "content": ""}],
        "add_generation_prompt": false, "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})J"),
  };
  return kContexts[i];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = litellama::ChatTemplate::parse(source);
  if (!tmpl.is_ok()) return 0;
  for (int i = 0; i < 2; ++i) {
    auto first = tmpl->render(contexts(i));
    auto second = tmpl->render(contexts(i));
    FUZZ_CHECK(first.is_ok() == second.is_ok(), "render succeeded once and failed once");
    if (first.is_ok()) FUZZ_CHECK(*first == *second, "render is not deterministic");
  }
  return 0;
}
