// Fuzz target: loading a tokenizer from an arbitrary tokenizer.json (services/tokenizer/), then
// encoding and decoding with it. The first input byte picks the tokenizer_config.json written
// beside it (none, a LlamaTokenizer one, one with a chat template); the rest is tokenizer.json.
// Properties: load returns a tokenizer or an error, never crashes; with a tokenizer it accepted,
// every encoded id is inside its vocabulary and the streaming detokenizer's output equals
// decode() of the same ids (incremental_detokenizer.h's promise).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "services/tokenizer/incremental_detokenizer.h"
#include "services/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const char* const kConfigs[] = {
    nullptr,
    R"J({"tokenizer_class": "LlamaTokenizer", "legacy": true, "bos_token": "<s>",
         "eos_token": "</s>"})J",
    R"J({"tokenizer_class": "LlamaTokenizerFast", "add_prefix_space": false})J",
    R"J({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"},
         "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
         "added_tokens_decoder": {"7": {"content": "<x>", "special": true}}})J",
};

const char* const kTexts[] = {
    "Hello world",
    "  two  spaces\n\ttab\r\n",
    "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
    "<s>[INST] hi [/INST]</s><|begin_of_text|><|eot_id|>",
    "\xff\xfe broken \xe6\x97 utf8",
    "1234567890 don't we'll",
};

// Feeds ids to a streaming detokenizer one at a time and compares with decode().
void check_stream(const litellama::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  litellama::IncrementalDetokenizer detok(tok, skip);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.push(std::span<const int32_t>(&id, 1));
  streamed += detok.finish();
  FUZZ_CHECK(streamed == tok.decode(ids, skip), "streamed text differs from decode()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  litellama::fuzz::Input in(data, size);
  const char* config = kConfigs[in.take_byte() % std::size(kConfigs)];
  const auto dir = litellama::fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  litellama::fuzz::write_file(dir / "tokenizer.json", in.rest());
  std::error_code ec;
  std::filesystem::remove(dir / "tokenizer_config.json", ec);
  if (config != nullptr) litellama::fuzz::write_file(dir / "tokenizer_config.json", config);

  auto tok = litellama::Tokenizer::load(dir.string());
  if (!tok.is_ok()) return 0;
  for (const char* text : kTexts) {
    for (bool add_special : {false, true}) {
      const std::vector<int32_t> ids = tok->encode(text, add_special);
      for (int32_t id : ids) {
        FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), "id " + std::to_string(id) +
                                                          " outside vocabulary of " +
                                                          std::to_string(tok->vocab_size()));
      }
      check_stream(*tok, ids, false);
      check_stream(*tok, ids, true);
    }
  }
  if (tok->has_chat_template()) {
    (void)tok->apply_chat_template({{"user", "hi"}, {"assistant", "yo"}}, true);
  }
  return 0;
}
