// SamplingParams: the sampling parameters of one request, one type from the client to the device
// sampler. The client messages carry it (a msgpack map, sampling_params_codec.h), the step ring
// holds it per sequence in shared memory, the worker's StepBatch and the CUDA sampler's rows
// embed it. Applied in this order to the last position's logits: repetition penalty (over
// prompt + generated ids, as in Hugging Face), frequency and presence penalties (over generated
// ids, as in the OpenAI API), temperature, top-k, top-p, min-p, then a draw from a
// counter-based generator keyed by (seed, index of the generated token), so a request samples
// the same tokens whatever else shares its batch.
//
// What must stay true: the layout is fixed (the ring maps it between processes and the device
// reads it): trivially copyable, standard layout, 40 bytes, seed 8-byte aligned.
#pragma once

#include <cstdint>
#include <type_traits>

namespace litellama::proto {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax after penalties)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float frequency_penalty = 0.0f;   // 0: off
  float presence_penalty = 0.0f;    // 0: off
  uint32_t reserved = 0;            // padding before seed; not on the wire
  uint64_t seed = 0;

  bool is_greedy() const { return temperature <= 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};
static_assert(sizeof(SamplingParams) == 40);
static_assert(std::is_trivially_copyable_v<SamplingParams>);
static_assert(std::is_standard_layout_v<SamplingParams>);

// The wire fields, in order: f(name, member pointer) for each (the codec's only list of them).
template <typename F>
void for_each_sampling_field(F&& f) {
  f("temperature", &SamplingParams::temperature);
  f("top_k", &SamplingParams::top_k);
  f("top_p", &SamplingParams::top_p);
  f("min_p", &SamplingParams::min_p);
  f("repetition_penalty", &SamplingParams::repetition_penalty);
  f("frequency_penalty", &SamplingParams::frequency_penalty);
  f("presence_penalty", &SamplingParams::presence_penalty);
  f("seed", &SamplingParams::seed);
}
inline constexpr uint32_t kSamplingWireFields = 8;

}  // namespace litellama::proto

namespace litellama {
using proto::SamplingParams;
}  // namespace litellama
