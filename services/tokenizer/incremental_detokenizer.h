// IncrementalDetokenizer: streaming decode for one sequence. Feed ids as they are generated; each
// push returns the text that is now final. Deltas are always valid UTF-8 and their concatenation
// (with finish()) equals Tokenizer::decode of all the ids: a multi-byte character split across
// tokens, an open run of byte-fallback tokens or a pending strip is held back until it is
// settled, and finish() flushes it the way decode() does (incomplete UTF-8 becomes U+FFFD).
// Cost is linear in the number of ids; nothing already returned is decoded again.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "services/tokenizer/decoder.h"
#include "services/tokenizer/tokenizer.h"

namespace litellama {

class IncrementalDetokenizer {
 public:
  // `tok` must outlive the detokenizer.
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false);

  // Returns the new text delta (may be empty).
  std::string push(std::span<const int32_t> ids);
  // Flushes anything held back; the detokenizer can then start a new sequence.
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool skip_special_tokens_;
  Decoder::Stream stream_;
};

}  // namespace litellama
