// The Grafana dashboard against live scrapes: every metric name in every PromQL expression of
// deploy/grafana/litellama-dashboard.json is exported by one of the three running services; the
// info gauges carry their labels; and after a workload every counter and histogram series has
// been written, except the ones only a failure writes (errors, aborts, lost peers).
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/integration/service_cluster.h"

namespace litellama {
namespace {

using testing::http_get;
using testing::metric_value;
using testing::ServiceCluster;

// Sample names of a Prometheus text exposition ("name{labels} value" or "name value").
std::set<std::string> sample_names(const std::string& body) {
  std::set<std::string> names;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    names.insert(line.substr(0, line.find_first_of("{ ")));
  }
  return names;
}

// Every "expr" string anywhere in the dashboard (panels, rows, templating).
void collect_exprs(const nlohmann::json& j, std::vector<std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "expr" && it.value().is_string()) {
        out->push_back(it.value().get<std::string>());
      } else {
        collect_exprs(it.value(), out);
      }
    }
  } else if (j.is_array()) {
    for (const auto& v : j) collect_exprs(v, out);
  }
}

// Runs requests through the cluster until each one is done; returns false on an error.
bool run_workload(ServiceCluster& cluster) {
  auto c = cluster.client();
  for (int i = 0; i < 3; ++i) {
    proto::GenerateRequest r;
    r.messages = {{"user", "hello there"}};
    r.max_tokens = 5;
    r.ignore_eos = true;
    auto done = c->generate(r, nullptr, 30000);
    if (!done.is_ok()) return false;
  }
  return cluster.wait_metric("litellama_scheduler_requests_finished_total{reason=\"length\"}", 3);
}

TEST(Observability, DashboardNamesOnlyMetricsTheServicesExport) {
  std::ifstream f(std::string(LITELLAMA_TEST_SOURCE_DIR) +
                  "/deploy/grafana/litellama-dashboard.json");
  ASSERT_TRUE(f.good()) << "deploy/grafana/litellama-dashboard.json missing";
  const nlohmann::json dashboard = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded()) << "the dashboard is not valid JSON";
  std::vector<std::string> exprs;
  collect_exprs(dashboard, &exprs);
  ASSERT_GE(exprs.size(), 20u) << "the dashboard lost its panels";

  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  ASSERT_TRUE(run_workload(cluster)) << cluster.logs();
  std::set<std::string> exported;
  for (int port : {cluster.scheduler_port(), cluster.worker_port(), cluster.tokenizer_port()}) {
    const auto [status, body] = http_get(port, "/metrics");
    ASSERT_EQ(status, 200);
    const auto names = sample_names(body);
    exported.insert(names.begin(), names.end());
  }
  const std::regex metric_name("litellama_[a-zA-Z0-9_:]*");
  size_t n_names = 0;
  for (const std::string& expr : exprs) {
    bool any = false;
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric_name);
         it != std::sregex_iterator(); ++it) {
      any = true;
      ++n_names;
      EXPECT_TRUE(exported.count(it->str()))
          << it->str() << " (in '" << expr << "') is not exported by any service";
    }
    EXPECT_TRUE(any) << "'" << expr << "' names no litellama metric";
  }
  EXPECT_GE(n_names, exprs.size());
  // The panels the operations view needs are all there.
  for (const char* needed :
       {"litellama_scheduler_time_to_first_token_seconds_bucket",
        "litellama_scheduler_inter_token_latency_seconds_bucket",
        "litellama_scheduler_e2e_request_latency_seconds_bucket",
        "litellama_scheduler_queue_time_seconds_bucket", "litellama_scheduler_requests_running",
        "litellama_scheduler_requests_waiting", "litellama_scheduler_kv_slots_used",
        "litellama_scheduler_kv_slots_cached", "litellama_scheduler_generation_tokens_total",
        "litellama_scheduler_requests_finished_total",
        "litellama_scheduler_hop_duration_seconds_bucket",
        "litellama_scheduler_prefix_cache_hit_tokens_total",
        "litellama_scheduler_prefix_cache_queried_tokens_total",
        "litellama_scheduler_prefix_cache_tokens",
        "litellama_scheduler_prefix_cache_evicted_tokens_total",
        "litellama_scheduler_preemptions_total", "litellama_scheduler_requests_waiting_by_priority",
        "litellama_build_info", "litellama_model_info"}) {
    bool used = false;
    for (const std::string& expr : exprs) used = used || expr.find(needed) != std::string::npos;
    EXPECT_TRUE(used) << "no panel shows " << needed;
  }
}

TEST(Observability, InfoGaugesAndEveryNonFailureSeriesIsWritten) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  ASSERT_TRUE(run_workload(cluster)) << cluster.logs();
  const std::string scheduler = cluster.scheduler_metrics();
  const std::string worker = cluster.worker_metrics();
  const std::string tokenizer = http_get(cluster.tokenizer_port(), "/metrics").second;

  const std::regex build_info("litellama_build_info\\{version=\"[0-9]+\\.[0-9]+\\.[0-9]+\"\\} 1");
  for (const std::string* body : {&scheduler, &worker, &tokenizer}) {
    EXPECT_TRUE(std::regex_search(*body, build_info)) << "no litellama_build_info{version}";
  }
  const std::string model = std::filesystem::path(cluster.model_dir()).filename().string();
  EXPECT_EQ(metric_value(worker, "litellama_model_info{device=\"cpu\",dtype=\"float32\",model=\"" +
                                     model + "\"}"),
            1)
      << worker;

  // Series that only a failure writes (and so stay 0 here), by name prefix.
  const std::vector<std::string> failure_only = {
      "litellama_scheduler_aborts_total",
      "litellama_scheduler_worker_lost_total",
      "litellama_scheduler_workers_refused_total",
      "litellama_scheduler_tokenizer_retries_exhausted_total",
      "litellama_scheduler_protocol_errors_total",
      "litellama_scheduler_requests_finished_total{reason=\"abort\"}",
      "litellama_scheduler_requests_finished_total{reason=\"error\"}",
      "litellama_scheduler_requests_finished_total{reason=\"stop\"}",
      "litellama_worker_step_errors_total",
      "litellama_worker_protocol_errors_total",
      "litellama_tokenizer_protocol_errors_total",
      // Written only when the KV pool or the waiting queue runs full.
      "litellama_scheduler_prefix_cache_evicted_tokens_total",
      "litellama_scheduler_preemptions_total",
      "litellama_scheduler_requests_overloaded_total",
      // Written only by requests with images (vision_integration_test checks them).
      "litellama_scheduler_images_total",
      "litellama_worker_image_handoff_seconds",
  };
  size_t n_checked = 0;
  for (const std::string* body : {&scheduler, &worker, &tokenizer}) {
    std::istringstream in(*body);
    std::string type_of_family;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        type_of_family = line.substr(line.rfind(' ') + 1);
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      if (type_of_family != "counter" && type_of_family != "histogram") continue;
      const std::string series = line.substr(0, line.rfind(' '));
      // A histogram is written when its count is; its buckets may stay 0.
      if (type_of_family == "histogram" && series.find("_count") == std::string::npos) continue;
      bool exempt = false;
      for (const auto& prefix : failure_only) exempt = exempt || series.rfind(prefix, 0) == 0;
      if (exempt) continue;
      ++n_checked;
      EXPECT_GT(std::atof(line.c_str() + line.rfind(' ') + 1), 0)
          << series << " is exported but nothing wrote it during a workload";
    }
  }
  EXPECT_GE(n_checked, 15u);
}

}  // namespace
}  // namespace litellama
