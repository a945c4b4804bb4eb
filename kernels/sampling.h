// Sampling on the device, one CTA per sampled row, with the semantics of the CPU sampler
// (services/worker/cpu_sampler.cpp): optional top-N raw logits first; then repetition penalty over
// prompt + generated ids, frequency/presence penalties over generated ids; greedy argmax (lowest id
// among equal maxima) when temperature is 0; else temperature, top-k (values tied with the k-th
// survive), top-p, min-p, and a draw u = uniform(seed, n_generated) * kept mass walked in
// descending logit order (ties: lower id first). The uniform is the CPU sampler's counter-based
// generator, bit for bit.
//
// The trick: every filter keeps a prefix of the descending order, so the kept set is "key >= k*"
// for one ordered 32-bit key of the float logit; each prefix boundary (k-th value, top-p crossing,
// the drawn token) is found by a 4-pass radix select over key bytes with per-bin counts or
// probability mass, with no sort. Known difference from the CPU: a tie group that straddles the
// top-p boundary survives whole (the CPU may cut it by id); the masses are summed in double with
// shared-memory atomics, so their last bits may vary run to run.
//
// Cost (H200, vocab 128256, one row; rows run in parallel, 32 rows take the same time): greedy
// 23 us; each top-N logit one more pass (~30 us); top-k 50 + top-p 0.9 about 300 us; top-p alone
// about 1.7 ms. The first radix pass puts nearly all logits into the few bins of their top key
// byte, and the double-precision shared atomics serialize there; spreading that pass (bins over
// the logit's distance from the max, integer fixed-point masses with warp-aggregated atomics) and
// splitting a row over several CTAs are the known next steps.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace litellama {

// Largest StepBatch::n_top_logits the device sampler returns.
inline constexpr int32_t kSamplingMaxTopLogits = 64;

// Per sampled row; staged by the host with the step's metadata.
struct SamplingRow {
  uint64_t seed = 0;
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t top_k = 0;
  int32_t n_generated = 0;
  // Penalty history: history_ids[history_begin .. history_end), the first n_prompt from the
  // prompt. Read only when a penalty is on.
  int32_t history_begin = 0;
  int32_t history_end = 0;
  int32_t n_prompt = 0;
  int32_t pad = 0;
};

bool sampling_supports(int32_t vocab_size, int32_t n_top);

// Bytes of the `token_marks` workspace for n_rows rows: int32 per (row, vocab id). It must be all
// zero before the first call; every call leaves it all zero again.
size_t sampling_workspace_size_bytes(int32_t n_rows, int32_t vocab_size);

Status launch_sampling(int32_t* sampled_ids,     // [n_rows]
                       int32_t* top_ids,         // [n_rows, n_top] (unused when n_top == 0)
                       float* top_logits,        // [n_rows, n_top]
                       float* logits,            // [n_rows, vocab] in; penalties applied in place
                       const SamplingRow* rows,  // [n_rows]
                       const int32_t* history_ids,  // [n_history]
                       int32_t n_rows, int32_t vocab_size, int32_t n_top,
                       int32_t* token_marks,  // workspace [n_rows, vocab], zero at rest
                       cudaStream_t stream);

}  // namespace litellama
