#include "common/image_token_runs.h"

namespace litellama {

Result<ImageTokenRuns> expand_image_token_runs(std::span<const int32_t> ids, int32_t image_token_id,
                                               int32_t n_tokens_per_image, size_t n_images) {
  if (n_tokens_per_image < 1) {
    return make_error(StatusCode::kInvalidArgument, "{} tokens per image is not a count",
                      n_tokens_per_image);
  }
  const auto rows = static_cast<size_t>(n_tokens_per_image);
  // The runs are checked before anything is expanded, so that a prompt of many image tokens
  // costs no memory before it is refused.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) in ids
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != image_token_id) continue;
    size_t end = i;
    while (end < ids.size() && ids[end] == image_token_id) ++end;
    const size_t run = end - i;
    if (run != 1 && run != rows) {
      return make_error(StatusCode::kInvalidArgument,
                        "a run of {} image tokens (id {}) in the prompt: an image is one image "
                        "token or exactly {}",
                        run, image_token_id, rows);
    }
    runs.emplace_back(i, end);
    i = end - 1;
  }
  if (runs.size() != n_images) {
    return make_error(StatusCode::kInvalidArgument,
                      "the prompt has {} images (image token id {}) but the request carries {}",
                      runs.size(), image_token_id, n_images);
  }
  ImageTokenRuns out;
  out.prompt_ids.reserve(ids.size() + n_images * (rows - 1));
  size_t next = 0;
  for (const auto& [begin, end] : runs) {
    out.prompt_ids.insert(out.prompt_ids.end(), ids.begin() + static_cast<ptrdiff_t>(next),
                          ids.begin() + static_cast<ptrdiff_t>(begin));
    out.image_positions.push_back(static_cast<int32_t>(out.prompt_ids.size()));
    out.prompt_ids.insert(out.prompt_ids.end(), rows, image_token_id);
    next = end;
  }
  out.prompt_ids.insert(out.prompt_ids.end(), ids.begin() + static_cast<ptrdiff_t>(next),
                        ids.end());
  return out;
}

}  // namespace litellama
