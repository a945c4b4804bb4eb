// Fuzz target: encode/decode round trips of the real tokenizers (assets/tokenizers/: Llama 3.1's
// byte-level BPE, Llama 2's byte-fallback BPE with Metaspace, Qwen3's NFC-normalizing BPE) on
// arbitrary text. The first input byte picks the tokenizer and the options; the rest is the text,
// valid UTF-8 or not. Properties: every id is inside the vocabulary; the streaming
// detokenizer's output equals decode(); for Llama 3.1 (no normalizer, byte-level, so lossless)
// decode(encode(text)) is the text with each ill-formed UTF-8 sequence replaced by U+FFFD.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "services/tokenizer/incremental_detokenizer.h"
#include "services/tokenizer/tokenizer.h"
#include "services/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr const char* kNames[] = {"llama3_1", "llama2", "qwen3"};

const litellama::Tokenizer& tokenizer(int i) {
  static std::unique_ptr<litellama::Tokenizer> loaded[std::size(kNames)];
  if (!loaded[i]) {
    const std::string dir = litellama::fuzz::source_dir() + "/assets/tokenizers/" + kNames[i];
    auto tok = litellama::Tokenizer::load(dir);
    FUZZ_CHECK(tok.is_ok(), "cannot load " + dir +
                                " (run scripts/fetch-assets.sh): " + tok.status().to_string());
    loaded[i] = std::make_unique<litellama::Tokenizer>(std::move(tok).value());
  }
  return *loaded[i];
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) (void)tokenizer(i);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  litellama::fuzz::Input in(data, size);
  const uint8_t choice = in.take_byte();
  const int which = choice % std::size(kNames);
  const bool add_special = (choice >> 2) & 1;
  const bool skip_special = (choice >> 3) & 1;
  const int chunk = 1 + ((choice >> 4) & 3);  // ids fed to the streaming detokenizer at a time
  const std::string_view text = in.rest();
  const litellama::Tokenizer& tok = tokenizer(which);

  const std::vector<int32_t> ids = tok.encode(text, add_special);
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id " + std::to_string(id) + " outside vocab");
  }
  const std::string decoded = tok.decode(ids, skip_special);
  litellama::IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    const size_t n = std::min<size_t>(chunk, ids.size() - i);
    streamed += detok.push(std::span<const int32_t>(ids.data() + i, n));
  }
  streamed += detok.finish();
  FUZZ_CHECK(streamed == decoded, "streamed text differs from decode()");
  if (which == 0 && !add_special && !skip_special) {
    FUZZ_CHECK(decoded == litellama::utf8::lossy(text), "Llama 3.1 round trip lost text");
  }
  return 0;
}
