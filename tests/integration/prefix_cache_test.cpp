// The prefix cache through the real services on the CPU backend (fp32): every request served
// with cached KV gives the same greedy ids and the same top logits, bit for bit, as on a cold
// server that computes its whole prompt; a full waiting queue refuses at once as overloaded.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <unordered_map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/service_cluster.h"

namespace litellama {
namespace {

using testing::metric_value;
using testing::ServiceCluster;

struct Answer {
  std::vector<int32_t> ids;
  std::vector<std::pair<int32_t, float>> top_logits;
  int32_t n_cached_tokens = -1;
  std::string error_code;
};

// Sends the requests together and collects every answer.
std::vector<Answer> run(net::SchedulerClient& client,
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
    if (!chunk.top_logits.empty()) a.top_logits = chunk.top_logits;
    if (chunk.finished) {
      a.n_cached_tokens = chunk.n_cached_tokens;
      ++n_done;
    }
  }
  EXPECT_EQ(n_done, index.size()) << "requests without an answer";
  return answers;
}

proto::GenerateRequest greedy(std::vector<int32_t> ids, int32_t max_tokens) {
  proto::GenerateRequest r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.top_logits = 8;
  return r;
}

TEST(PrefixCacheIntegration, CachedPrefixesGiveBitIdenticalIdsAndTopLogits) {
  std::mt19937 rng(29);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids;
    for (int k = 0; k < n; ++k) ids.push_back(static_cast<int32_t>(rng() % 120000));
    return ids;
  };
  // A shared "system prompt", questions after it, one prompt that is another's prefix plus more,
  // a repeated prompt, and a second turn that sends the first turn's answer back.
  const std::vector<int32_t> system = random_ids(37);
  std::vector<proto::GenerateRequest> first, second;
  first.push_back(greedy(system, 6));
  first.back().prompt_ids.push_back(11);
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> ids = system;
    for (int32_t id : random_ids(1 + i * 3)) ids.push_back(id);
    second.push_back(greedy(ids, 5 + i));
  }
  second.push_back(greedy(first[0].prompt_ids, 6));  // the same prompt again
  std::vector<int32_t> longer = second[2].prompt_ids;
  longer.insert(longer.end(), {5, 6, 7});
  second.push_back(greedy(longer, 4));

  // Warm server (the cache is on by default): the first request fills the cache, the others
  // run together against it, then a second turn of the first conversation.
  ServiceCluster warm;
  ASSERT_NO_FATAL_FAILURE(warm.start_all());
  auto client = warm.client();
  const std::vector<Answer> warm_first = run(*client, first);
  const std::vector<Answer> warm_second = run(*client, second);
  ASSERT_EQ(warm_first[0].ids.size(), 6u) << warm.logs();
  std::vector<int32_t> turn2 = first[0].prompt_ids;
  turn2.insert(turn2.end(), warm_first[0].ids.begin(), warm_first[0].ids.end());
  turn2.insert(turn2.end(), {42, 43});
  const std::vector<Answer> warm_turn2 = run(*client, {greedy(turn2, 5)});

  // Cold server: each request alone, nothing cached.
  ServiceCluster cold;
  cold.add_scheduler_args({"--no-prefix-cache"});
  ASSERT_NO_FATAL_FAILURE(cold.start_all());
  auto cold_client = cold.client();
  auto alone = [&](const proto::GenerateRequest& r) { return run(*cold_client, {r})[0]; };

  const Answer ref_first = alone(first[0]);
  EXPECT_EQ(warm_first[0].ids, ref_first.ids);
  EXPECT_EQ(warm_first[0].top_logits, ref_first.top_logits);
  EXPECT_EQ(warm_first[0].n_cached_tokens, 0);
  for (size_t i = 0; i < second.size(); ++i) {
    const Answer ref = alone(second[i]);
    ASSERT_EQ(ref.top_logits.size(), 8u);
    EXPECT_EQ(ref.n_cached_tokens, 0) << "the cold server cached something";
    EXPECT_EQ(warm_second[i].ids, ref.ids) << "request " << i;
    // Exact float equality: the cached KV is the very KV a cold prefill writes.
    EXPECT_EQ(warm_second[i].top_logits, ref.top_logits) << "request " << i;
    EXPECT_GE(warm_second[i].n_cached_tokens, static_cast<int32_t>(system.size()))
        << "request " << i;
  }
  EXPECT_EQ(warm_second[5].n_cached_tokens, static_cast<int32_t>(first[0].prompt_ids.size()) - 1);
  const Answer ref_turn2 = alone(greedy(turn2, 5));
  EXPECT_EQ(warm_turn2[0].ids, ref_turn2.ids);
  EXPECT_EQ(warm_turn2[0].top_logits, ref_turn2.top_logits);
  // The first turn's prompt and all but its last answer id had KV (the last was never fed).
  EXPECT_EQ(warm_turn2[0].n_cached_tokens,
            static_cast<int32_t>(first[0].prompt_ids.size() + warm_first[0].ids.size()) - 1);

  const std::string m = warm.scheduler_metrics();
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_hit_tokens_total"), 0);
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_queried_tokens_total"),
            metric_value(m, "litellama_scheduler_prefix_cache_hit_tokens_total"));
  EXPECT_GT(metric_value(m, "litellama_scheduler_prefix_cache_tokens"), 0);
  EXPECT_EQ(
      metric_value(cold.scheduler_metrics(), "litellama_scheduler_prefix_cache_hit_tokens_total"),
      0);
}

TEST(PrefixCacheIntegration, AFullWaitingQueueRefusesAtOnceAsOverloaded) {
  ServiceCluster cluster;
  cluster.add_scheduler_args({"--max-waiting-requests", "2"});
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto client = cluster.client();
  // A burst far larger than one step admits: the requests arriving while two wait are refused.
  std::vector<proto::GenerateRequest> requests;
  for (int i = 0; i < 60; ++i) {
    requests.push_back(greedy({1, 2, 3, static_cast<int32_t>(i)}, 40));
  }
  const auto answers = run(*client, requests);
  int n_overloaded = 0, n_done = 0;
  for (const Answer& a : answers) {
    if (a.error_code == "overloaded") ++n_overloaded;
    if (a.error_code.empty() && a.ids.size() == 40u) ++n_done;
  }
  // Every request got its end: refused as overloaded or complete; nobody was left to time out.
  EXPECT_GE(n_overloaded, 1);
  EXPECT_GE(n_done, 1);
  EXPECT_EQ(n_overloaded + n_done, 60);
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_requests_overloaded_total", n_overloaded));
}

std::pair<int, std::string> run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// `litellama bench --workload shared-prefix / multi-turn` at small sizes: every request (every
// turn) completes, and the server reports prompt tokens served from its cache.
TEST(PrefixCacheIntegration, BenchSharedPrefixAndMultiTurnWorkloads) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  const std::string bench =
      cluster.bin_dir() + "/litellama bench --json --server " + cluster.endpoint("client");
  const auto [rc, out] = run_command(bench +
                                     " --workload shared-prefix --groups 2 --prompts-per-group 3 "
                                     "--system-len 48 --question-len 4 --output-len 3 -c 2");
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["workload"], "shared-prefix");
  EXPECT_EQ(j["n_completed"], 6);
  EXPECT_EQ(j["input_tokens"], 6 * 52);
  EXPECT_EQ(j["output_tokens"], 6 * 3);
  // Concurrency 2: at most two requests of a group compute its system prompt.
  EXPECT_GE(j["cached_prompt_tokens"].get<int64_t>(), 2 * 48);

  const auto [rc2, out2] = run_command(
      bench +
      " --workload multi-turn --conversations 2 --turns 3 --question-len 5 --output-len 2 "
      "--seed 1");  // another seed: nothing in common with the ids sent before
  ASSERT_EQ(rc2, 0) << out2;
  const auto k = nlohmann::json::parse(out2.substr(out2.find('{')));
  EXPECT_EQ(k["n_requests"], 6);
  EXPECT_EQ(k["n_completed"], 6);
  // Turn t sends 5 t + 2 (t - 1) ids: 5, 12, 19 per conversation.
  EXPECT_EQ(k["input_tokens"], 2 * (5 + 12 + 19));
  // Turns 2 and 3 find all but the last id of the turn before cached: 6 and 13.
  EXPECT_EQ(k["cached_prompt_tokens"], 2 * (6 + 13));

  const auto [rc3, out3] = run_command(bench + " --workload nonsense");
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("--workload"), std::string::npos) << out3;
}

// 100 requests against a KV pool a tenth of what they need together: admission without
// reservation preempts by recompute, and every request completes with the greedy ids it gets
// alone on a cold server (CPU, fp32).
TEST(PrefixCacheIntegration, TinyPoolPreemptsAndEveryRequestMatchesRunningAlone) {
  constexpr int32_t kPool = 360;
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  cluster.start_scheduler();
  std::vector<std::string> worker = cluster.worker_argv(testing::free_tcp_port());
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
    requests.push_back(greedy(ids, 16 + static_cast<int32_t>(rng() % 16)));
    requests.back().top_logits = 0;
    need += static_cast<int64_t>(ids.size()) + requests.back().max_tokens;
  }
  ASSERT_GE(need, 10 * kPool);
  auto client = cluster.client();
  const std::vector<Answer> together = run(*client, requests);
  const std::string m = cluster.scheduler_metrics();
  const double preemptions = metric_value(m, "litellama_scheduler_preemptions_total");
  std::cout << "preemptions: " << preemptions << " (100 requests needing " << need
            << " KV slots, pool " << kPool << ")\n";
  EXPECT_GT(preemptions, 0);

  ServiceCluster cold;
  cold.add_scheduler_args({"--no-prefix-cache"});
  ASSERT_NO_FATAL_FAILURE(cold.start_all());
  auto cold_client = cold.client();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(together[i].error_code.empty()) << i << ": " << together[i].error_code;
    const Answer alone = run(*cold_client, {requests[i]})[0];
    EXPECT_EQ(together[i].ids, alone.ids) << "request " << i;
    EXPECT_EQ(together[i].ids.size(), static_cast<size_t>(requests[i].max_tokens));
  }
}

}  // namespace
}  // namespace litellama
