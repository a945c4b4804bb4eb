// OfflineEngine: in-process generation over a ModelRunner, for `litellama generate` and as the
// reference the served path is tested against. Requests are admitted together, prefilled in one
// packed step (mixed lengths), then decoded together; each finishes on its own stop condition.
// Its KV slots come from a plain free list: the pool is the runner's, sized by RunnerOptions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/proto/sampling_params.h"
#include "common/status.h"
#include "services/worker/model_runner.h"

namespace litellama {

enum class FinishReason { kStop, kLength };
const char* finish_reason_name(FinishReason reason);

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  int32_t n_top_logits = 0;  // return the largest raw logits of the first generated position
  // Rows that replace the embedding lookup of some prompt tokens (LLaVA's image features at the
  // image-token positions): prompt position input_embedding_positions[j] takes row j of
  // input_embeddings, [n, hidden_size] float32. Empty: none.
  std::vector<int32_t> input_embedding_positions;  // strictly increasing
  std::vector<float> input_embeddings;
  // Return the logprob of every generated id and, per position, the n_top_logprobs most likely
  // (id, logprob): of the raw distribution, before penalties and temperature.
  bool logprobs = false;
  int32_t n_top_logprobs = 0;
};

struct GenerationResult {
  std::vector<int32_t> output_ids;
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<std::pair<int32_t, float>> top_logits;  // of the first generated position
  std::vector<float> logprobs;                        // with logprobs: one per output id
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
};

struct OfflineEngineOptions {
  // Largest number of prompt tokens packed in one prefill step; longer prompts are chunked.
  int32_t max_prefill_tokens = 4096;
};

class OfflineEngine {
 public:
  explicit OfflineEngine(ModelRunner& runner, OfflineEngineOptions options = {});

  // Runs all requests to completion. Fails (without partial results) when a request is invalid
  // or the KV pool cannot hold all of them at full length.
  Result<std::vector<GenerationResult>> generate(const std::vector<GenerationRequest>& requests);

 private:
  ModelRunner& runner_;
  OfflineEngineOptions options_;
};

}  // namespace litellama
