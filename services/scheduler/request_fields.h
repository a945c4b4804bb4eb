// Checks of a GenerateRequest's fields and the per-token outputs a GenerateChunk carries, apart
// from SchedulerService's message handling.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/proto/client_messages.h"
#include "common/proto/tokenizer_messages.h"
#include "common/status.h"
#include "services/scheduler/request.h"

namespace litellama {

// kInvalidArgument naming the first sampling option out of range, else ok.
Status validate_sampling(const SamplingParams& s);

// kInvalidArgument when top_logprobs is outside [0, kMaxTopLogprobs] or set without logprobs.
Status validate_logprobs(const proto::GenerateRequest& msg);

// Asks the detokenization item for the bytes of r's output ids [from, to) and their top ids.
void add_piece_ids(const Request& r, int32_t from, int32_t to, proto::DetokenizeItem* item);
// Stores the pieces the tokenizer returned for output ids [from, to) (add_piece_ids' order).
void store_pieces(Request* r, int32_t from, int32_t to, const std::vector<std::string>& pieces);

// Appends r's logprobs of output ids [begin, end) to the chunk (aligned with its token_ids).
void append_logprobs(const Request& r, size_t begin, size_t end, proto::GenerateChunk* chunk);

}  // namespace litellama
