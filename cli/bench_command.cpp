// litellama bench: a serving benchmark against a running scheduler, in the manner of vLLM's and
// SGLang's: N requests of random token ids at a given concurrency and/or Poisson request rate,
// fixed or random prompt/output lengths (EOS ignored so outputs have the asked length). Reports
// TTFT, TPOT, inter-token latency and end-to-end latency (mean, p50, p90, p99) and request and
// token throughput.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/generate_remote.h"
#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"

namespace litellama::cli {

namespace {

struct BenchArgs {
  std::string server;
  int32_t n_requests = 64;
  int32_t concurrency = 8;    // 0: no limit
  double request_rate = 0.0;  // requests/s, Poisson; 0: all at once (bounded by concurrency)
  int32_t input_len = 128;
  int32_t output_len = 64;
  double range_ratio = 1.0;  // lengths uniform in [ratio * len, len]; 1: fixed
  uint64_t seed = 0;
  bool json = false;
  int32_t timeout_ms = 300000;
};

struct RequestRecord {
  double t_submit = 0.0;
  double t_first = 0.0;
  double t_last = 0.0;
  int32_t n_prompt = 0;
  int32_t n_output = 0;
  std::vector<double> itl;
  bool ok = false;
  bool done = false;
};

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  auto pct = [&](double p) {
    const double idx = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(idx));
    const size_t hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  s.p50 = pct(0.5);
  s.p90 = pct(0.9);
  s.p99 = pct(0.99);
  return s;
}

int run_bench(const BenchArgs& a) {
  const char* cmd = "bench";
  auto client = net::SchedulerClient::connect(server_endpoint(a.server));
  if (!client.is_ok()) return fail(cmd, client.status());
  net::SchedulerClient& c = **client;
  if (Status st = c.wait_ready(30000); !st) return fail(cmd, st);
  auto info = c.server_info(5000);
  if (!info.is_ok()) return fail(cmd, info.status());
  const int32_t vocab = std::max(2, info->vocab_size);

  std::mt19937_64 rng(a.seed);
  auto length = [&](int32_t len) {
    const int32_t lo = std::max(1, static_cast<int32_t>(std::lround(len * a.range_ratio)));
    return std::uniform_int_distribution<int32_t>(std::min(lo, len), len)(rng);
  };
  std::vector<proto::GenerateRequest> requests(static_cast<size_t>(a.n_requests));
  for (auto& r : requests) {
    r.prompt_ids.resize(static_cast<size_t>(length(a.input_len)));
    for (auto& id : r.prompt_ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
    r.max_tokens = length(a.output_len);
    r.ignore_eos = true;
  }
  std::vector<double> arrivals(requests.size(), 0.0);
  if (a.request_rate > 0) {
    std::exponential_distribution<double> gap(a.request_rate);
    double t = 0;
    for (double& x : arrivals) {
      x = t;
      t += gap(rng);
    }
  }

  std::vector<RequestRecord> records(requests.size());
  std::unordered_map<uint64_t, size_t> by_id;
  size_t next = 0, n_done = 0, n_in_flight = 0;
  const double start = net::monotonic_seconds();
  double last_progress = 0;
  while (n_done < requests.size()) {
    const double now = net::monotonic_seconds() - start;
    while (next < requests.size() && arrivals[next] <= now &&
           (a.concurrency <= 0 || n_in_flight < static_cast<size_t>(a.concurrency))) {
      auto id = c.submit(requests[next]);
      if (!id.is_ok()) return fail(cmd, id.status());
      by_id[*id] = next;
      records[next].t_submit = net::monotonic_seconds() - start;
      records[next].n_prompt = static_cast<int32_t>(requests[next].prompt_ids.size());
      ++next;
      ++n_in_flight;
    }
    int wait_ms = 50;
    if (next < requests.size() && a.request_rate > 0) {
      wait_ms = std::clamp(static_cast<int>((arrivals[next] - now) * 1000), 0, 50);
    }
    auto event = c.next_event(wait_ms);
    if (!event.is_ok()) return fail(cmd, event.status());
    if (*event) {
      auto it = by_id.find((*event)->request_id());
      if (it != by_id.end()) {
        RequestRecord& rec = records[it->second];
        const double t = net::monotonic_seconds() - start;
        bool finished = false;
        if ((*event)->kind == net::ClientEvent::Kind::kError) {
          finished = true;
        } else {
          const auto& chunk = (*event)->chunk;
          if (!chunk.token_ids.empty()) {
            if (rec.n_output == 0) {
              rec.t_first = t;
            } else {
              rec.itl.push_back(t - rec.t_last);
            }
            rec.t_last = t;
            rec.n_output += static_cast<int32_t>(chunk.token_ids.size());
          }
          if (chunk.finished) {
            finished = true;
            rec.ok = true;
            rec.t_last = t;
          }
        }
        if (finished) {
          rec.done = true;
          ++n_done;
          --n_in_flight;
          by_id.erase(it);
        }
      }
    }
    if (now - last_progress > 0.5 || n_done == requests.size()) {
      last_progress = now;
      std::fprintf(stderr, "\rbench: %zu/%zu requests done", n_done, requests.size());
    }
    if (now * 1000 > a.timeout_ms) return fail(cmd, Status(StatusCode::kUnavailable, "timed out"));
  }
  std::fprintf(stderr, "\n");
  const double duration = net::monotonic_seconds() - start;

  std::vector<double> ttft, tpot, itl, e2e;
  int64_t n_in = 0, n_out = 0, n_ok = 0;
  for (const RequestRecord& r : records) {
    if (!r.ok) continue;
    ++n_ok;
    n_in += r.n_prompt;
    n_out += r.n_output;
    ttft.push_back(r.t_first - r.t_submit);
    e2e.push_back(r.t_last - r.t_submit);
    if (r.n_output > 1) tpot.push_back((r.t_last - r.t_first) / (r.n_output - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const Summary s_ttft = summarize(ttft), s_tpot = summarize(tpot), s_itl = summarize(itl),
                s_e2e = summarize(e2e);
  if (a.json) {
    auto js = [](const Summary& s) {
      return nlohmann::json{{"mean_ms", s.mean * 1e3},
                            {"p50_ms", s.p50 * 1e3},
                            {"p90_ms", s.p90 * 1e3},
                            {"p99_ms", s.p99 * 1e3}};
    };
    nlohmann::json j;
    j["n_requests"] = a.n_requests;
    j["n_completed"] = n_ok;
    j["concurrency"] = a.concurrency;
    j["request_rate"] = a.request_rate;
    j["duration_seconds"] = duration;
    j["input_tokens"] = n_in;
    j["output_tokens"] = n_out;
    j["request_throughput"] = n_ok / duration;
    j["output_token_throughput"] = n_out / duration;
    j["total_token_throughput"] = (n_in + n_out) / duration;
    j["ttft"] = js(s_ttft);
    j["tpot"] = js(s_tpot);
    j["itl"] = js(s_itl);
    j["e2e_latency"] = js(s_e2e);
    std::printf("%s\n", j.dump(2).c_str());
    return n_ok == a.n_requests ? 0 : 1;
  }
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %10lld / %d\n", "Successful requests:", static_cast<long long>(n_ok),
              a.n_requests);
  std::printf("%-40s %10.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-40s %10lld\n", "Total input tokens:", static_cast<long long>(n_in));
  std::printf("%-40s %10lld\n", "Total generated tokens:", static_cast<long long>(n_out));
  std::printf("%-40s %10.2f\n", "Request throughput (req/s):", n_ok / duration);
  std::printf("%-40s %10.2f\n", "Output token throughput (tok/s):", n_out / duration);
  std::printf("%-40s %10.2f\n", "Total token throughput (tok/s):", (n_in + n_out) / duration);
  auto block = [](const char* title, const char* name, const Summary& s) {
    std::printf("---------------%s---------------\n", title);
    std::printf("Mean %-35s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.mean * 1e3);
    std::printf("P50 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p50 * 1e3);
    std::printf("P90 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p90 * 1e3);
    std::printf("P99 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p99 * 1e3);
  };
  block("Time to First Token", "TTFT", s_ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", s_tpot);
  block("Inter-token Latency", "ITL", s_itl);
  block("End-to-end Latency", "E2E", s_e2e);
  std::printf("==================================================\n");
  return n_ok == a.n_requests ? 0 : 1;
}

}  // namespace

CommandMain register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "serving benchmark against a running scheduler");
  sub->add_option("--server", a->server, "scheduler address (default: litellama serve's)");
  sub->add_option("--num-requests,-n", a->n_requests, "requests to send")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  sub->add_option("--concurrency,-c", a->concurrency, "requests in flight at most (0: no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--request-rate", a->request_rate, "Poisson arrivals per second (0: all at once)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--input-len", a->input_len, "prompt tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--output-len", a->output_len, "generated tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--random-range-ratio", a->range_ratio,
                  "lengths uniform in [ratio * len, len] (1: fixed)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", a->seed, "seed of the random prompts and lengths");
  sub->add_flag("--json", a->json, "print one JSON object");
  return [a] { return run_bench(*a); };
}

}  // namespace litellama::cli
