#include "services/scheduler/request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace litellama {

Status validate_sampling(const SamplingParams& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature)) {
    return Status(StatusCode::kInvalidArgument, "temperature must be >= 0");
  }
  if (s.top_k < 0) return Status(StatusCode::kInvalidArgument, "top_k must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Status(StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  }
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
    return Status(StatusCode::kInvalidArgument, "min_p must be in [0, 1]");
  }
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty)) {
    return Status(StatusCode::kInvalidArgument, "repetition_penalty must be > 0");
  }
  if (!std::isfinite(s.frequency_penalty) || !std::isfinite(s.presence_penalty)) {
    return Status(StatusCode::kInvalidArgument, "penalties must be finite");
  }
  return Status::ok();
}

Status validate_logprobs(const proto::GenerateRequest& msg) {
  if (msg.top_logprobs < 0 || msg.top_logprobs > proto::kMaxTopLogprobs) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("top_logprobs must be in [0, {}]", proto::kMaxTopLogprobs));
  }
  if (msg.top_logprobs > 0 && !msg.logprobs) {
    return Status(StatusCode::kInvalidArgument, "top_logprobs needs logprobs");
  }
  return Status::ok();
}

void add_piece_ids(const Request& r, int32_t from, int32_t to, proto::DetokenizeItem* item) {
  for (auto i = static_cast<size_t>(std::max(0, from)); i < static_cast<size_t>(to); ++i) {
    if (i >= r.output_ids.size()) break;
    item->piece_ids.push_back(r.output_ids[i]);
    if (i < r.output_top_logprobs.size()) {
      for (const auto& [id, lp] : r.output_top_logprobs[i]) item->piece_ids.push_back(id);
    }
  }
}

void store_pieces(Request* r, int32_t from, int32_t to, const std::vector<std::string>& pieces) {
  size_t k = 0;
  for (auto i = static_cast<size_t>(std::max(0, from)); i < static_cast<size_t>(to); ++i) {
    if (i >= r->output_ids.size()) break;
    if (r->output_pieces.size() <= i) r->output_pieces.resize(i + 1);
    const size_t n =
        1 + (i < r->output_top_logprobs.size() ? r->output_top_logprobs[i].size() : size_t{0});
    auto& out = r->output_pieces[i];
    out.clear();
    for (size_t j = 0; j < n && k < pieces.size(); ++j) out.push_back(pieces[k++]);
  }
}

void append_logprobs(const Request& r, size_t begin, size_t end, proto::GenerateChunk* chunk) {
  for (size_t i = begin; i < end; ++i) {
    chunk->pieces.push_back(i < r.output_pieces.size() ? r.output_pieces[i]
                                                       : std::vector<std::string>{});
    chunk->logprobs.push_back(i < r.output_logprobs.size() ? r.output_logprobs[i] : NAN);
    chunk->top_logprobs.push_back(i < r.output_top_logprobs.size()
                                      ? r.output_top_logprobs[i]
                                      : std::vector<std::pair<int32_t, float>>{});
  }
}

}  // namespace litellama
