#include "cli/bench_workloads.h"

#include <algorithm>
#include <cmath>

namespace litellama::cli {

Result<Workload> Workload::create(const WorkloadOptions& options, int32_t vocab_size) {
  const std::string& k = options.kind;
  if (k != "random" && k != "shared-prefix" && k != "multi-turn") {
    return make_error(StatusCode::kInvalidArgument,
                      "--workload '{}' is not one of random, shared-prefix, multi-turn", k);
  }
  Workload w;
  w.options_ = options;
  w.vocab_ = std::max(2, vocab_size);
  w.rng_.seed(options.seed);
  w.seeds_.seed(options.seed ^ 0x5eed5eed5eed5eedull);  // apart, so prompts do not change
  if (k == "random") {
    for (int32_t i = 0; i < options.n_requests; ++i) {
      std::vector<int32_t> prompt = w.random_ids(w.length(options.input_len));
      const int32_t n_out = w.length(options.output_len);
      w.initial_.push_back(w.make(std::move(prompt), n_out));
    }
  } else if (k == "shared-prefix") {
    for (int32_t g = 0; g < options.groups; ++g) {
      const std::vector<int32_t> system = w.random_ids(options.system_len);
      for (int32_t p = 0; p < options.prompts_per_group; ++p) {
        std::vector<int32_t> prompt = system;
        const std::vector<int32_t> question = w.random_ids(options.question_len);
        prompt.insert(prompt.end(), question.begin(), question.end());
        w.initial_.push_back(w.make(std::move(prompt), options.output_len));
      }
    }
    std::shuffle(w.initial_.begin(), w.initial_.end(), w.rng_);
  } else {
    for (int32_t c = 0; c < options.conversations; ++c) {
      std::vector<int32_t> question = w.random_ids(w.length(options.question_len));
      w.initial_.push_back(w.make(std::move(question), w.length(options.output_len)));
      w.turn_of_.emplace_back(c, 0);
      w.history_.push_back(w.initial_.back().prompt_ids);
    }
  }
  w.total_ = k == "multi-turn"
                 ? static_cast<int64_t>(options.conversations) * std::max(1, options.turns)
                 : static_cast<int64_t>(w.initial_.size());
  return w;
}

int32_t Workload::length(int32_t len) {
  const int32_t lo = std::max(1, static_cast<int32_t>(std::lround(len * options_.range_ratio)));
  return std::uniform_int_distribution<int32_t>(std::min(lo, len), len)(rng_);
}

std::vector<int32_t> Workload::random_ids(int32_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(std::max(1, n)));
  for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab_ - 1)(rng_);
  return ids;
}

proto::GenerateRequest Workload::make(std::vector<int32_t> prompt, int32_t max_tokens) {
  proto::GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = std::max(1, max_tokens);
  r.ignore_eos = true;
  r.sampling = options_.sampling;
  r.sampling.seed = seeds_();
  return r;
}

std::optional<proto::GenerateRequest> Workload::follow_up(size_t index,
                                                          const std::vector<int32_t>& output_ids) {
  if (options_.kind != "multi-turn" || index >= turn_of_.size()) return std::nullopt;
  const auto [conversation, turn] = turn_of_[index];
  if (turn + 1 >= options_.turns) return std::nullopt;
  // The history as sent plus the answer, then the next question.
  std::vector<int32_t> prompt = history_[index];
  prompt.insert(prompt.end(), output_ids.begin(), output_ids.end());
  const std::vector<int32_t> question = random_ids(length(options_.question_len));
  prompt.insert(prompt.end(), question.begin(), question.end());
  turn_of_.emplace_back(conversation, turn + 1);
  history_.push_back(prompt);
  return make(std::move(prompt), length(options_.output_len));
}

int64_t Workload::n_follow_ups_lost(size_t index) const {
  if (options_.kind != "multi-turn" || index >= turn_of_.size()) return 0;
  return std::max(0, options_.turns - 1 - turn_of_[index].second);
}

}  // namespace litellama::cli
