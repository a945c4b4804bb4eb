// Stateless incremental detokenization (the scheme of vLLM's detokenize_incrementally): the text
// of ids[read_offset:] is decode(ids) minus decode(ids[:read_offset]), where the leading ids are
// a few tokens of context. While the decoded window ends in U+FFFD (a character still split across
// tokens) nothing is emitted and the caller keeps the window; `final` flushes it regardless.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/proto/tokenizer_messages.h"
#include "common/status.h"

namespace litellama {

using DecodeFn = std::function<Result<std::string>(std::span<const int32_t> ids)>;

Result<proto::DetokenizeResult> detokenize_window(const proto::DetokenizeItem& item,
                                                  const DecodeFn& decode);

}  // namespace litellama
