#include "services/tokenizer/incremental_detokenizer.h"

namespace litellama {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_tokens_(skip_special_tokens), stream_(tok.decoder()) {}

std::string IncrementalDetokenizer::push(std::span<const int32_t> ids) {
  std::string delta;
  for (const int32_t id : ids) {
    if (const std::string* token = tok_->token_for_decode(id, skip_special_tokens_)) {
      stream_.push(*token, delta);
    }
  }
  return delta;
}

std::string IncrementalDetokenizer::finish() {
  std::string delta;
  stream_.finish(delta);
  return delta;
}

}  // namespace litellama
