// A LLaVA prompt's images: each is a run of the image token, written once (expanded here to the
// image's token count) or already expanded to exactly that count. The scheduler places the images
// of served requests with it and `litellama generate` those of in-process ones, so both take and
// refuse the same prompts with the same words.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace litellama {

struct ImageTokenRuns {
  std::vector<int32_t> prompt_ids;       // every run n_tokens_per_image long
  std::vector<int32_t> image_positions;  // first position of each image, in prompt order
};

// kInvalidArgument for a run of any other length, or a number of runs other than n_images.
Result<ImageTokenRuns> expand_image_token_runs(std::span<const int32_t> ids, int32_t image_token_id,
                                               int32_t n_tokens_per_image, size_t n_images);

}  // namespace litellama
