#include "services/worker/offline_engine.h"

#include <algorithm>

namespace litellama {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "?";
}

OfflineEngine::OfflineEngine(ModelRunner& runner, OfflineEngineOptions options)
    : runner_(runner), options_(options) {}

namespace {

struct Sequence {
  const GenerationRequest* request = nullptr;
  std::vector<int32_t> slots;  // KV slot of each position so far
  int32_t n_prefilled = 0;     // prompt tokens already in the KV cache
  GenerationResult result;
  bool done = false;
};

}  // namespace

Result<std::vector<GenerationResult>> OfflineEngine::generate(
    const std::vector<GenerationRequest>& requests) {
  const ModelConfig& config = runner_.config();
  int64_t slots_needed = 0;
  bool any_penalties = false;
  int32_t n_top = 0;
  bool any_logprobs = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    if (r.prompt_ids.empty()) {
      return make_error(StatusCode::kInvalidArgument, "request {}: the prompt is empty", i);
    }
    for (int32_t id : r.prompt_ids) {
      if (id < 0 || id >= config.vocab_size) {
        return make_error(StatusCode::kInvalidArgument,
                          "request {}: token id {} is outside the vocabulary (size {})", i, id,
                          config.vocab_size);
      }
    }
    if (r.max_new_tokens < 1) {
      return make_error(StatusCode::kInvalidArgument, "request {}: max_new_tokens must be >= 1", i);
    }
    if (r.n_top_logits < 0 || r.n_top_logits > config.vocab_size) {
      return make_error(StatusCode::kInvalidArgument,
                        "request {}: top logits count {} is out of "
                        "range",
                        i, r.n_top_logits);
    }
    if (!r.input_embedding_positions.empty()) {
      const size_t n = r.input_embedding_positions.size();
      if (!runner_.supports_input_embeddings(EmbeddingMemory::kHost)) {
        return make_error(StatusCode::kUnsupported,
                          "request {}: this backend does not take input embeddings", i);
      }
      if (r.input_embeddings.size() != n * static_cast<size_t>(config.hidden_size)) {
        return make_error(StatusCode::kInvalidArgument,
                          "request {}: {} embedding values for {} positions of hidden size {}", i,
                          r.input_embeddings.size(), n, config.hidden_size);
      }
      for (size_t j = 0; j < n; ++j) {
        const int32_t p = r.input_embedding_positions[j];
        if (p < 0 || p >= static_cast<int32_t>(r.prompt_ids.size()) ||
            (j > 0 && p <= r.input_embedding_positions[j - 1])) {
          return make_error(StatusCode::kInvalidArgument,
                            "request {}: embedding position {} is outside the prompt or not "
                            "increasing",
                            i, p);
        }
      }
    }
    slots_needed += static_cast<int64_t>(r.prompt_ids.size()) + r.max_new_tokens;
    any_penalties = any_penalties || r.sampling.has_penalties();
    n_top = std::max(n_top, r.n_top_logits);
    if (r.logprobs) {
      if (r.n_top_logprobs < 0 || r.n_top_logprobs > config.vocab_size) {
        return make_error(StatusCode::kInvalidArgument,
                          "request {}: top logprobs count {} is out of range", i, r.n_top_logprobs);
      }
      any_logprobs = true;
      n_top = std::max(n_top, r.n_top_logprobs);
    }
  }
  if (slots_needed > runner_.n_kv_slots()) {
    return make_error(StatusCode::kResourceExhausted,
                      "the requests need {} KV slots but the pool has {}", slots_needed,
                      runner_.n_kv_slots());
  }

  // Token-granular free list; slots are taken one token at a time, so sequences interleave.
  std::vector<int32_t> free_slots(static_cast<size_t>(runner_.n_kv_slots()));
  for (size_t i = 0; i < free_slots.size(); ++i) {
    free_slots[i] = static_cast<int32_t>(free_slots.size() - 1 - i);
  }
  auto take_slot = [&]() {
    const int32_t s = free_slots.back();
    free_slots.pop_back();
    return s;
  };

  std::vector<Sequence> seqs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) seqs[i].request = &requests[i];

  StepBatch batch;
  StepOutput out;
  std::vector<float> embed_rows;  // this step's given embedding rows, gathered in token order
  std::vector<size_t> in_batch;
  size_t n_done = 0;
  while (n_done < seqs.size()) {
    batch.clear();
    embed_rows.clear();
    batch.n_top_logits = n_top;
    batch.logprobs = any_logprobs;
    in_batch.clear();
    int32_t prefill_budget = options_.max_prefill_tokens;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      if (s.done) continue;
      const GenerationRequest& r = *s.request;
      const auto n_prompt = static_cast<int32_t>(r.prompt_ids.size());
      std::span<const int32_t> new_tokens;
      bool sample = true;
      if (s.n_prefilled < n_prompt) {
        if (prefill_budget <= 0) continue;
        const int32_t n = std::min(prefill_budget, n_prompt - s.n_prefilled);
        new_tokens = std::span<const int32_t>(r.prompt_ids)
                         .subspan(static_cast<size_t>(s.n_prefilled), static_cast<size_t>(n));
        prefill_budget -= n;
        // Given rows of the prompt positions in this chunk, at their packed token indices.
        const auto& pos = r.input_embedding_positions;
        const auto first = std::lower_bound(pos.begin(), pos.end(), s.n_prefilled);
        for (auto it = first; it != pos.end() && *it < s.n_prefilled + n; ++it) {
          batch.embed_token_index.push_back(batch.n_tokens() + (*it - s.n_prefilled));
          const auto row = static_cast<size_t>(it - pos.begin()) * config.hidden_size;
          embed_rows.insert(embed_rows.end(), r.input_embeddings.begin() + row,
                            r.input_embeddings.begin() + row + config.hidden_size);
        }
        s.n_prefilled += n;
        sample = s.n_prefilled == n_prompt;
      } else {
        new_tokens = std::span<const int32_t>(&s.result.output_ids.back(), 1);
      }
      for (size_t k = 0; k < new_tokens.size(); ++k) s.slots.push_back(take_slot());
      batch.add_sequence(new_tokens, s.slots, sample, r.sampling,
                         static_cast<int32_t>(s.result.output_ids.size()));
      if (any_penalties) batch.set_history(r.prompt_ids, s.result.output_ids);
      in_batch.push_back(i);
    }
    if (!batch.embed_token_index.empty()) batch.embed_rows = embed_rows.data();
    LITELLAMA_RETURN_IF_ERROR(runner_.step(batch, &out));
    for (size_t b = 0; b < in_batch.size(); ++b) {
      Sequence& s = seqs[in_batch[b]];
      const int32_t id = out.sampled_ids[b];
      if (id < 0) continue;  // a prefill chunk that is not the prompt's last
      if (s.result.output_ids.empty() && s.request->n_top_logits > 0) {
        const auto& top = out.top_logits[b];
        s.result.top_logits.assign(
            top.begin(), top.begin() + std::min<size_t>(top.size(), s.request->n_top_logits));
      }
      if (s.request->logprobs) {
        s.result.logprobs.push_back(out.logprobs[b]);
        const auto& top = out.top_logits[b];
        auto& list = s.result.top_logprobs.emplace_back();
        const size_t k = std::min<size_t>(top.size(), s.request->n_top_logprobs);
        for (size_t j = 0; j < k; ++j) list.emplace_back(top[j].first, top[j].second - out.lse[b]);
      }
      s.result.output_ids.push_back(id);
      const auto& stops = s.request->stop_token_ids;
      if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
        s.result.finish_reason = FinishReason::kStop;
        s.done = true;
      } else if (static_cast<int32_t>(s.result.output_ids.size()) >= s.request->max_new_tokens) {
        s.result.finish_reason = FinishReason::kLength;
        s.done = true;
      }
      if (s.done) {
        ++n_done;
        free_slots.insert(free_slots.end(), s.slots.rbegin(), s.slots.rend());
        s.slots.clear();
      }
    }
  }
  std::vector<GenerationResult> results;
  results.reserve(seqs.size());
  for (auto& s : seqs) results.push_back(std::move(s.result));
  return results;
}

}  // namespace litellama
