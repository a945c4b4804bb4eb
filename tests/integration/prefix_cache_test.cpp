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

#include "tests/integration/prefix_cache_checks.h"

namespace litellama {
namespace {

using testing::Answer;
using testing::metric_value;
using testing::ServiceCluster;

constexpr auto greedy = testing::greedy_request;
constexpr auto run = testing::run_together;

TEST(PrefixCacheIntegration, CachedPrefixesGiveBitIdenticalIdsAndTopLogits) {
  testing::check_cached_prefixes({}, testing::Match::kExact);
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
  testing::check_tiny_pool({}, testing::Match::kExact);
}

}  // namespace
}  // namespace litellama
