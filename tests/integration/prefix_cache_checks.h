// Checks of the prefix cache and of preemption through the real services, shared by the CPU
// tests (tests/integration/prefix_cache_test.cpp) and the CUDA ones
// (tests/gpu/cuda_prefix_cache_test.cpp), which pass the worker's device and dtype flags.
//
// kExact: every answer equals the reference bit for bit (ids and top logits), as cached KV is the
// very KV a cold prefill writes and a float32 step does not depend on what shares its batch: on
// the CPU by construction, on the GPU through the batch-invariant float32 kernels
// (RunnerOptions::float32_batch_invariant).
// kHalfPrecision: the first generated id is the same and the first step's top logits are within
// the 16-bit tolerance of the golden GPU tests; how many whole id sequences are identical is
// printed (a near tie may turn a later step either way).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tests/integration/service_cluster.h"

namespace litellama::testing {

enum class Match { kExact, kHalfPrecision };

struct Answer {
  std::vector<int32_t> ids;
  std::vector<std::pair<int32_t, float>> first_top_logits;  // of the first generated token
  std::vector<std::pair<int32_t, float>> top_logits;        // of the last one
  int32_t n_cached_tokens = -1;
  std::string error_code;
};

// Sends the requests together and collects every answer.
inline std::vector<Answer> run_together(net::SchedulerClient& client,
                                        const std::vector<proto::GenerateRequest>& requests) {
  std::unordered_map<uint64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = client.submit(requests[i]);
    EXPECT_TRUE(id.is_ok());
    if (id.is_ok()) index[*id] = i;
  }
  std::vector<Answer> answers(requests.size());
  size_t n_done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (n_done < index.size() && std::chrono::steady_clock::now() < deadline) {
    auto event = client.next_event(100);
    if (!event.is_ok() || !*event) continue;
    auto it = index.find((*event)->request_id());
    if (it == index.end()) continue;
    Answer& a = answers[it->second];
    if ((*event)->kind == net::ClientEvent::Kind::kError) {
      a.error_code = (*event)->error.code;
      ++n_done;
      continue;
    }
    const auto& chunk = (*event)->chunk;
    a.ids.insert(a.ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
    if (!chunk.top_logits.empty()) {
      if (a.first_top_logits.empty()) a.first_top_logits = chunk.top_logits;
      a.top_logits = chunk.top_logits;
    }
    if (chunk.finished) {
      a.n_cached_tokens = chunk.n_cached_tokens;
      ++n_done;
    }
  }
  EXPECT_EQ(n_done, index.size()) << "requests without an answer";
  return answers;
}

inline proto::GenerateRequest greedy_request(std::vector<int32_t> ids, int32_t max_tokens) {
  proto::GenerateRequest r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.top_logits = 8;
  return r;
}

// Whether `got` answers as `ref` does under `match` (failures name `what`); returns whether the
// whole id sequences are equal.
inline bool expect_same_answer(const Answer& got, const Answer& ref, Match match,
                               const std::string& what) {
  if (match == Match::kExact) {
    EXPECT_EQ(got.ids, ref.ids) << what;
    EXPECT_EQ(got.top_logits, ref.top_logits) << what;
    return got.ids == ref.ids;
  }
  EXPECT_FALSE(ref.ids.empty()) << what;
  EXPECT_FALSE(got.ids.empty()) << what;
  if (ref.ids.empty() || got.ids.empty()) return false;
  EXPECT_EQ(got.ids.front(), ref.ids.front()) << what;
  EXPECT_EQ(got.first_top_logits.size(), ref.first_top_logits.size()) << what;
  const size_t n = std::min(got.first_top_logits.size(), ref.first_top_logits.size());
  if (n > 0) {
    const double scale =
        std::max(1.0, std::abs(static_cast<double>(ref.first_top_logits[0].second)));
    for (size_t k = 0; k < n; ++k) {
      EXPECT_NEAR(got.first_top_logits[k].second, ref.first_top_logits[k].second, 3e-2 * scale)
          << what << " rank " << k;
    }
  }
  return got.ids == ref.ids;
}

// A shared "system prompt", questions after it, one prompt that is another's prefix plus more, a
// repeated prompt and a second turn that sends the first turn's answer back: on a warm server
// (the cache is on by default) against each request alone on a cold one (--no-prefix-cache).
inline void check_cached_prefixes(const std::vector<std::string>& worker_args, Match match) {
  std::mt19937 rng(29);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids;
    for (int k = 0; k < n; ++k) ids.push_back(static_cast<int32_t>(rng() % 120000));
    return ids;
  };
  const std::vector<int32_t> system = random_ids(37);
  std::vector<proto::GenerateRequest> first, second;
  first.push_back(greedy_request(system, 6));
  first.back().prompt_ids.push_back(11);
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> ids = system;
    for (int32_t id : random_ids(1 + i * 3)) ids.push_back(id);
    second.push_back(greedy_request(ids, 5 + i));
  }
  second.push_back(greedy_request(first[0].prompt_ids, 6));  // the same prompt again
  std::vector<int32_t> longer = second[2].prompt_ids;
  longer.insert(longer.end(), {5, 6, 7});
  second.push_back(greedy_request(longer, 4));

  // Warm: the first request fills the cache, the others run together against it, then a second
  // turn of the first conversation.
  ServiceCluster warm;
  warm.add_worker_args(worker_args);
  ASSERT_NO_FATAL_FAILURE(warm.start_all());
  auto client = warm.client();
  const std::vector<Answer> warm_first = run_together(*client, first);
  const std::vector<Answer> warm_second = run_together(*client, second);
  ASSERT_EQ(warm_first[0].ids.size(), 6u) << warm.logs();
  std::vector<int32_t> turn2 = first[0].prompt_ids;
  turn2.insert(turn2.end(), warm_first[0].ids.begin(), warm_first[0].ids.end());
  turn2.insert(turn2.end(), {42, 43});
  const std::vector<Answer> warm_turn2 = run_together(*client, {greedy_request(turn2, 5)});

  ServiceCluster cold;
  cold.add_worker_args(worker_args);
  cold.add_scheduler_args({"--no-prefix-cache"});
  ASSERT_NO_FATAL_FAILURE(cold.start_all());
  auto cold_client = cold.client();
  auto alone = [&](const proto::GenerateRequest& r) { return run_together(*cold_client, {r})[0]; };

  int n_identical = 0;
  const Answer ref_first = alone(first[0]);
  n_identical += expect_same_answer(warm_first[0], ref_first, match, "first request");
  EXPECT_EQ(warm_first[0].n_cached_tokens, 0);
  for (size_t i = 0; i < second.size(); ++i) {
    const Answer ref = alone(second[i]);
    ASSERT_EQ(ref.top_logits.size(), 8u);
    EXPECT_EQ(ref.n_cached_tokens, 0) << "the cold server cached something";
    n_identical += expect_same_answer(warm_second[i], ref, match, "request " + std::to_string(i));
    EXPECT_GE(warm_second[i].n_cached_tokens, static_cast<int32_t>(system.size()))
        << "request " << i;
  }
  EXPECT_EQ(warm_second[5].n_cached_tokens, static_cast<int32_t>(first[0].prompt_ids.size()) - 1);
  const Answer ref_turn2 = alone(greedy_request(turn2, 5));
  n_identical += expect_same_answer(warm_turn2[0], ref_turn2, match, "second turn");
  // The first turn's prompt and all but its last answer id had KV (the last was never fed).
  EXPECT_EQ(warm_turn2[0].n_cached_tokens,
            static_cast<int32_t>(first[0].prompt_ids.size() + warm_first[0].ids.size()) - 1);
  std::cout << "cached against cold: " << n_identical << " of " << second.size() + 2
            << " requests with identical ids\n";

  const std::string m = warm.scheduler_metrics();
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_hit_tokens_total"), 0);
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_queried_tokens_total"),
            metric_value(m, "litellama_scheduler_prefix_cache_hit_tokens_total"));
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_tokens"), 0);
  EXPECT_EQ(
      metric_value(cold.scheduler_metrics(), "litellama_scheduler_prefix_cache_hit_tokens_total"),
      0);
}

// 100 requests against a KV pool a tenth of what they need together: admission without
// reservation preempts by recompute, and every request completes; in float32 each has the greedy
// ids it gets alone on a cold server, with kHalfPrecision how many do is printed.
inline void check_tiny_pool(const std::vector<std::string>& worker_args, Match match) {
  constexpr int32_t kPool = 360;
  ServiceCluster cluster;
  cluster.add_worker_args(worker_args);
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  cluster.start_scheduler();
  std::vector<std::string> worker = cluster.worker_argv(free_tcp_port());
  auto slots = std::find(worker.begin(), worker.end(), "--kv-slots");
  ASSERT_NE(slots, worker.end());
  *(slots + 1) = std::to_string(kPool);
  cluster.start_process("worker", worker);
  cluster.start_tokenizer();
  ASSERT_NO_FATAL_FAILURE(cluster.wait_ready());

  std::mt19937 rng(100);
  std::vector<proto::GenerateRequest> requests;
  int64_t need = 0;
  for (int i = 0; i < 100; ++i) {
    std::vector<int32_t> ids;
    for (int k = 10 + static_cast<int>(rng() % 12); k > 0; --k) {
      ids.push_back(static_cast<int32_t>(rng() % 120000));
    }
    requests.push_back(greedy_request(ids, 16 + static_cast<int32_t>(rng() % 16)));
    requests.back().top_logits = 0;
    need += static_cast<int64_t>(ids.size()) + requests.back().max_tokens;
  }
  ASSERT_GE(need, 10 * kPool);
  auto client = cluster.client();
  const std::vector<Answer> together = run_together(*client, requests);
  const std::string m = cluster.scheduler_metrics();
  const double preemptions = metric_value(m, "litellama_scheduler_preemptions_total");
  std::cout << "preemptions: " << preemptions << " (100 requests needing " << need
            << " KV slots, pool " << kPool << ")\n";
  EXPECT_GT(preemptions, 0);

  ServiceCluster cold;
  cold.add_worker_args(worker_args);
  cold.add_scheduler_args({"--no-prefix-cache"});
  ASSERT_NO_FATAL_FAILURE(cold.start_all());
  auto cold_client = cold.client();
  int n_identical = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(together[i].error_code.empty()) << i << ": " << together[i].error_code;
    EXPECT_EQ(together[i].ids.size(), static_cast<size_t>(requests[i].max_tokens));
    const Answer alone = run_together(*cold_client, {requests[i]})[0];
    n_identical += together[i].ids == alone.ids;
    if (match != Match::kHalfPrecision) {
      EXPECT_EQ(together[i].ids, alone.ids) << "request " << i;
    }
  }
  std::cout << "together against alone: " << n_identical << " of " << requests.size()
            << " requests with identical greedy ids\n";
}

}  // namespace litellama::testing
