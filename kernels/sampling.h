// Sampling on the device, with the semantics of the CPU sampler (services/worker/cpu_sampler.cpp):
// optional top-N raw logits and logprobs (SamplingLogprobs) first; then repetition penalty over
// prompt + generated ids, frequency/presence penalties over generated ids; greedy argmax (lowest id
// among equal maxima) when temperature is 0; else temperature, top-k (values tied with the k-th
// survive), top-p, min-p, and a draw u = uniform(seed, n_generated) * kept mass walked in
// descending logit order (ties: lower id first). The uniform is the CPU sampler's counter-based
// generator, bit for bit.
//
// The trick: every filter keeps a prefix of the descending order, so the kept set is "key >= k*"
// for one ordered 32-bit key of the float logit; each prefix boundary (k-th value, top-p crossing,
// the drawn token) is found by a 4-pass radix select over key bytes with per-bin counts or
// probability mass, with no sort. A tie group that straddles the top-p boundary survives whole,
// on the CPU too. Known differences from the CPU: every mass of a draw (the total, the
// kept mass, the histogram bins) is a sum of weights rounded to multiples of 2^-44 (fixed point:
// the bins' sums are exact and order-independent), so masses differ from the CPU's sequential
// double sums in their last bits, and a token whose weight (its probability over the most likely
// one's) is below 2^-45 is never drawn, where the CPU draws one of those with a probability of at
// most vocab x 2^-45 (about 4e-9 for 128k ids).
//
// Each row is sampled by a group of CTAs that split its logits (kernels/sampling.cu): on compute
// capability 9.0+ a thread-block cluster of up to 8 CTAs that meet in distributed shared memory.
// A launch whose rows are all greedy without penalties or top-N logits (greedy_only) runs a plain
// argmax kernel instead, up to 16 CTAs per row.
//
// The cost of one launch is measured by `cuda_sampling_test --gtest_also_run_disabled_tests
// --gtest_filter='*Timing*'`; bench/RESULTS.md has the current figures.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/proto/sampling_params.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// Largest StepBatch::n_top_logits the device sampler returns.
inline constexpr int32_t kSamplingMaxTopLogits = 64;
// Largest vocabulary the device sampler takes (its fixed-point masses, kernels/sampling.cu).
inline constexpr int32_t kSamplingMaxVocab = 1 << 19;

// Per sampled row; staged by the host with the step's metadata.
struct SamplingRow {
  SamplingParams params;  // the request's, as the client sent them
  int32_t n_generated = 0;
  // Penalty history: history_ids[history_begin .. history_end), the first n_prompt from the
  // prompt. Read only when a penalty is on.
  int32_t history_begin = 0;
  int32_t history_end = 0;
  int32_t n_prompt = 0;
  int32_t pad = 0;
};

// Logprob outputs of a launch; logprobs == nullptr: none. Logprobs are of the raw logits as the
// launch receives them (before penalties and temperature): per row r, lse[r] is the log-sum-exp
// of the row in fp32 (maximum, then the sum of exp(logit - maximum)) and logprobs[r] the sampled
// id's raw logit less lse[r]. The top-N logits less lse[r] are the top logprobs. history_raw
// ([n_history] floats, contents not kept) is scratch where rows with penalties save the raw
// logits the penalties overwrite.
struct SamplingLogprobs {
  float* logprobs = nullptr;     // [n_rows]
  float* lse = nullptr;          // [n_rows]
  float* history_raw = nullptr;  // [n_history]
};

bool sampling_supports(int32_t vocab_size, int32_t n_top);

// Bytes of the `token_marks` workspace for n_rows rows: an int32 per (row, vocab id) and 16 bytes
// per row (20 for an odd vocabulary). It must be all zero before the first call; every call
// leaves it all zero again.
size_t sampling_workspace_size_bytes(int32_t n_rows, int32_t vocab_size);

Status launch_sampling(int32_t* sampled_ids,     // [n_rows]
                       int32_t* top_ids,         // [n_rows, n_top] (unused when n_top == 0)
                       float* top_logits,        // [n_rows, n_top]
                       float* logits,            // [n_rows, vocab] in; penalties applied in place
                       const SamplingRow* rows,  // [n_rows]
                       const int32_t* history_ids,  // [n_history]
                       int32_t n_rows, int32_t vocab_size, int32_t n_top,
                       int32_t* token_marks,  // workspace, zero at rest
                       KernelStream stream,
                       // every row greedy (temperature 0) without penalties: with n_top == 0 a
                       // plain argmax kernel runs
                       bool greedy_only = false,
                       // CTAs per row at most; 0: the launcher's choice (tests pass others)
                       int32_t max_ctas_per_row = 0,
                       // logprobs of every row (the greedy_only argmax kernel then does not run)
                       const SamplingLogprobs& logprobs = SamplingLogprobs{});

}  // namespace litellama
