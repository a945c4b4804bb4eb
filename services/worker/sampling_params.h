// Per-request sampling parameters, applied in this order to the last position's logits:
// repetition penalty (over prompt + generated ids, as in Hugging Face), frequency and presence
// penalties (over generated ids, as in the OpenAI API), temperature, top-k, top-p, min-p, then a
// draw from a counter-based generator keyed by (seed, index of the generated token), so a request
// samples the same tokens whatever else shares its batch.
#pragma once

#include <cstdint>

namespace litellama {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax after penalties)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float frequency_penalty = 0.0f;   // 0: off
  float presence_penalty = 0.0f;    // 0: off
  uint64_t seed = 0;

  bool is_greedy() const { return temperature <= 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

}  // namespace litellama
