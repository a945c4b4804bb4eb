// The request streams `litellama bench` can send (--workload):
// - random: independent prompts of random ids (--input-len, --output-len, --random-range-ratio).
// - shared-prefix: --groups G groups of --prompts-per-group P requests; every request of a group
//   starts with the group's --system-len S ids and ends with its own --question-len Q ids, and
//   generates --output-len O ids (defaults 64, 16, 2048, 128, 256, as SGLang's
//   generated-shared-prefix benchmark). Requests are sent in a shuffled order.
// - multi-turn: --conversations N conversations of --turns T turns; each turn sends the whole
//   history (every earlier question and answer) followed by a new question of --question-len
//   ids, and starts only once the previous turn of its conversation has finished. With
//   --random-range-ratio R < 1 each question and answer length is uniform in [R len, len], so
//   that conversations drift apart instead of sending their turns in synchronized waves (with one
//   fixed length every conversation finishes its turn in the same step, and the next turns
//   arrive together and queue behind each other).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/proto/client_messages.h"
#include "common/status.h"

namespace litellama::cli {

struct WorkloadOptions {
  std::string kind = "random";
  int32_t n_requests = 64;  // random
  int32_t input_len = 128;  // random
  int32_t output_len = 64;  // every kind (shared-prefix and multi-turn default to 256)
  double range_ratio = 1.0;
  int32_t groups = 64;
  int32_t prompts_per_group = 16;
  int32_t system_len = 2048;
  int32_t question_len = 128;
  int32_t conversations = 16;
  int32_t turns = 4;
  uint64_t seed = 0;
  SamplingParams sampling;
};

class Workload {
 public:
  static Result<Workload> create(const WorkloadOptions& options, int32_t vocab_size);

  // Requests that may be sent from the start, in sending order.
  std::vector<proto::GenerateRequest>& initial() { return initial_; }
  // How many requests the whole run sends (follow-up turns included).
  int64_t total_requests() const { return total_; }
  // The request that follows request `index` (an index into the run's list: initial requests
  // first, then follow-ups in the order this returned them) once it finished with output_ids;
  // nullopt when none does.
  std::optional<proto::GenerateRequest> follow_up(size_t index,
                                                  const std::vector<int32_t>& output_ids);
  bool needs_outputs() const { return options_.kind == "multi-turn"; }
  // Requests that will never be sent because request `index` failed (its conversation's later
  // turns).
  int64_t n_follow_ups_lost(size_t index) const;

 private:
  proto::GenerateRequest make(std::vector<int32_t> prompt, int32_t max_tokens);
  // A length uniform in [range_ratio * len, len] (len itself when the ratio is 1).
  int32_t length(int32_t len);
  std::vector<int32_t> random_ids(int32_t n);

  WorkloadOptions options_;
  int32_t vocab_ = 2;
  std::mt19937_64 rng_;
  std::mt19937_64 seeds_;
  std::vector<proto::GenerateRequest> initial_;
  int64_t total_ = 0;
  // multi-turn: conversation and turn of every request of the run, by index.
  std::vector<std::pair<int32_t, int32_t>> turn_of_;
  std::vector<std::vector<int32_t>> history_;  // the prompt each request sent
};

}  // namespace litellama::cli
