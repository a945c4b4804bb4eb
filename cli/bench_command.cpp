// litellama bench: a serving benchmark against a running scheduler, in the manner of vLLM's and
// SGLang's: N requests of random token ids at a given concurrency and/or Poisson request rate,
// fixed or random prompt/output lengths (EOS ignored so outputs have the asked length). Reports
// TTFT, TPOT, inter-token latency and end-to-end latency (mean, p50, p90, p99) and request and
// token throughput. --workload shared-prefix and multi-turn send the streams bench_workloads.h
// describes (prefix-cache benchmarks).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_http.h"
#include "cli/bench_workloads.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/generate_remote.h"
#include "common/cli_option.h"
#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"

namespace litellama::cli {

namespace {

struct BenchArgs {
  std::string server;
  int32_t concurrency = 8;    // 0: no limit
  double request_rate = 0.0;  // requests/s, Poisson; 0: all at once (bounded by concurrency)
  bool json = false;
  int32_t timeout_ms = 300000;
  std::string sweep;  // "C:N,...": one run per (concurrency C, N requests), one table
  // Sizes, seed and sampling of the requests; the kind and the shared-prefix / multi-turn sizes.
  WorkloadOptions workload;
  int32_t priority = 0;  // of every request
  std::string base_url;  // an OpenAI-compatible server instead of the scheduler
  std::string api_key;
  std::string model;           // --base-url: the model to name ("" : the first /models lists)
  int32_t vocab_size = 32000;  // --base-url: prompt ids are drawn below this
};

struct RequestRecord {
  double t_submit = 0.0;
  double t_first = 0.0;
  double t_last = 0.0;
  int32_t n_prompt = 0;
  int32_t n_output = 0;
  std::vector<double> itl;
  bool ok = false;
  std::string error;  // "code: message" of the request's error, if it got one
  bool done = false;
  int32_t n_cached = 0;         // prompt tokens the server served from its prefix cache
  std::vector<int32_t> output;  // kept only when the workload builds on answers (multi-turn)
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

struct BenchResult {
  int64_t n_requests = 0;  // sent or due (every turn of every conversation)
  int64_t n_ok = 0, n_in = 0, n_out = 0, n_cached = 0;
  std::map<std::string, int64_t> errors;  // the scheduler's error message -> requests
  double duration = 0;
  Summary ttft, tpot, itl, e2e;
};

// The workload of a run (bench_workloads.h) with every request's priority, and the arrival
// times of its first requests: all at once, or a Poisson process at a.request_rate.
Result<Workload> make_workload(const BenchArgs& a, int32_t vocab,
                               std::vector<proto::GenerateRequest>* requests,
                               std::vector<double>* arrivals) {
  LITELLAMA_ASSIGN_OR_RETURN(Workload workload, Workload::create(a.workload, vocab));
  *requests = std::move(workload.initial());
  for (auto& r : *requests) r.priority = a.priority;
  std::mt19937_64 rng(a.workload.seed ^ 0xa7717a1ull);
  arrivals->assign(requests->size(), 0.0);
  if (a.request_rate > 0) {
    std::exponential_distribution<double> gap(a.request_rate);
    double t = 0;
    for (double& x : *arrivals) {
      x = t;
      t += gap(rng);
    }
  }
  return workload;
}

BenchResult summarize_run(const std::vector<RequestRecord>& records, int64_t n_total,
                          double duration);

// Sends the workload's requests as a.concurrency / a.request_rate say and times their streams.
Result<BenchResult> run_load(net::SchedulerClient& c, const BenchArgs& a, int32_t vocab) {
  std::vector<proto::GenerateRequest> requests;
  std::vector<double> arrivals;
  LITELLAMA_ASSIGN_OR_RETURN(Workload workload, make_workload(a, vocab, &requests, &arrivals));
  const size_t n_total = static_cast<size_t>(workload.total_requests());

  std::vector<RequestRecord> records(n_total);
  std::unordered_map<uint64_t, size_t> by_id;
  size_t next = 0, n_done = 0, n_in_flight = 0;
  const double start = net::monotonic_seconds();
  double last_progress = 0;
  while (n_done < n_total) {
    const double now = net::monotonic_seconds() - start;
    while (next < requests.size() && arrivals[next] <= now &&
           (a.concurrency <= 0 || n_in_flight < static_cast<size_t>(a.concurrency))) {
      auto id = c.submit(requests[next]);
      if (!id.is_ok()) return id.status();
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
    if (!event.is_ok()) return event.status();
    if (*event) {
      auto it = by_id.find((*event)->request_id());
      if (it != by_id.end()) {
        RequestRecord& rec = records[it->second];
        const double t = net::monotonic_seconds() - start;
        bool finished = false;
        if ((*event)->kind == net::ClientEvent::Kind::kError) {
          finished = true;
          rec.error = (*event)->error.code + ": " + (*event)->error.message;
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
          if (workload.needs_outputs()) {
            rec.output.insert(rec.output.end(), chunk.token_ids.begin(), chunk.token_ids.end());
          }
          if (chunk.finished) {
            finished = true;
            rec.ok = true;
            rec.t_last = t;
            rec.n_cached = chunk.n_cached_tokens;
            // A conversation's next turn can go once this answer is complete; it is due now.
            if (auto more = workload.follow_up(it->second, rec.output)) {
              more->priority = a.priority;
              requests.push_back(std::move(*more));
              arrivals.push_back(0.0);
            }
          }
        }
        if (finished) {
          rec.done = true;
          // A failed turn ends its conversation: the turns after it are never sent.
          n_done += 1;
          if (!rec.ok) n_done += static_cast<size_t>(workload.n_follow_ups_lost(it->second));
          --n_in_flight;
          by_id.erase(it);
        }
      }
    }
    if (now - last_progress > 0.5 || n_done == n_total) {
      last_progress = now;
      std::fprintf(stderr, "\rbench: %zu/%zu requests done", n_done, n_total);
    }
    if (now * 1000 > a.timeout_ms) return Status(StatusCode::kUnavailable, "timed out");
  }
  std::fprintf(stderr, "\n");
  return summarize_run(records, static_cast<int64_t>(n_total), net::monotonic_seconds() - start);
}

// The same workload against an OpenAI-compatible server (--base-url).
// Conversations need each answer's text for their next turn, which this path does not keep:
// the multi-turn workload is refused with --base-url.
Result<BenchResult> run_load_http(const BenchArgs& a, const std::string& model, int32_t vocab) {
  std::vector<proto::GenerateRequest> requests;
  std::vector<double> arrivals;
  LITELLAMA_ASSIGN_OR_RETURN(Workload workload, make_workload(a, vocab, &requests, &arrivals));
  if (workload.needs_outputs()) {
    return make_error(StatusCode::kInvalidArgument,
                      "--workload {} is not supported with --base-url", a.workload.kind);
  }
  std::vector<HttpBenchRequest> http_requests;
  for (const auto& r : requests) http_requests.push_back({r.prompt_ids, r.max_tokens, r.sampling});
  std::vector<HttpBenchRecord> http_records;
  LITELLAMA_ASSIGN_OR_RETURN(double duration,
                             run_http_load(a.base_url, a.api_key, model, http_requests, arrivals,
                                           a.concurrency, a.timeout_ms, &http_records));
  std::vector<RequestRecord> records(http_records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const HttpBenchRecord& h = http_records[i];
    RequestRecord& r = records[i];
    r.t_submit = h.t_submit;
    r.t_first = h.t_first;
    r.t_last = h.t_last;
    r.n_prompt = static_cast<int32_t>(requests[i].prompt_ids.size());
    r.n_output = h.n_output;
    r.itl = h.itl;
    r.ok = h.ok;
    r.error = h.error;
    r.done = true;
  }
  return summarize_run(records, static_cast<int64_t>(records.size()), duration);
}

BenchResult summarize_run(const std::vector<RequestRecord>& records, int64_t n_total,
                          double duration) {
  BenchResult result;
  result.n_requests = n_total;
  result.duration = duration;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.error.empty()) ++result.errors[r.error];
    if (!r.ok) continue;
    ++result.n_ok;
    result.n_in += r.n_prompt;
    result.n_out += r.n_output;
    result.n_cached += r.n_cached;
    ttft.push_back(r.t_first - r.t_submit);
    e2e.push_back(r.t_last - r.t_submit);
    if (r.n_output > 1) tpot.push_back((r.t_last - r.t_first) / (r.n_output - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  result.ttft = summarize(ttft);
  result.tpot = summarize(tpot);
  result.itl = summarize(itl);
  result.e2e = summarize(e2e);
  return result;
}

nlohmann::json to_json(const BenchArgs& a, const BenchResult& r) {
  auto js = [](const Summary& s) {
    return nlohmann::json{{"mean_ms", s.mean * 1e3},
                          {"p50_ms", s.p50 * 1e3},
                          {"p90_ms", s.p90 * 1e3},
                          {"p99_ms", s.p99 * 1e3}};
  };
  nlohmann::json j;
  j["workload"] = a.workload.kind;
  j["n_requests"] = r.n_requests;
  j["n_completed"] = r.n_ok;
  j["concurrency"] = a.concurrency;
  j["request_rate"] = a.request_rate;
  j["temperature"] = a.workload.sampling.temperature;
  j["top_k"] = a.workload.sampling.top_k;
  j["top_p"] = a.workload.sampling.top_p;
  j["duration_seconds"] = r.duration;
  j["input_tokens"] = r.n_in;
  j["output_tokens"] = r.n_out;
  j["cached_prompt_tokens"] = r.n_cached;
  j["request_throughput"] = static_cast<double>(r.n_ok) / r.duration;
  j["output_token_throughput"] = static_cast<double>(r.n_out) / r.duration;
  j["total_token_throughput"] = static_cast<double>(r.n_in + r.n_out) / r.duration;
  j["ttft"] = js(r.ttft);
  j["tpot"] = js(r.tpot);
  j["itl"] = js(r.itl);
  j["e2e_latency"] = js(r.e2e);
  j["errors"] = r.errors;
  return j;
}

void print_text(const BenchArgs& a, const BenchResult& r) {
  const double out_rate = static_cast<double>(r.n_out) / r.duration;
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %10lld / %lld\n", "Successful requests:", static_cast<long long>(r.n_ok),
              static_cast<long long>(r.n_requests));
  for (const auto& [why, n] : r.errors) {
    std::printf("Failed requests: %lld (%s)\n", static_cast<long long>(n), why.c_str());
  }
  std::printf("%-40s %10.2f\n", "Benchmark duration (s):", r.duration);
  std::printf("%-40s %10lld\n", "Total input tokens:", static_cast<long long>(r.n_in));
  std::printf("%-40s %10lld\n", "Total generated tokens:", static_cast<long long>(r.n_out));
  std::printf("%-40s %10lld\n",
              "Prompt tokens from the prefix cache:", static_cast<long long>(r.n_cached));
  std::printf("%-40s %10.2f\n",
              "Request throughput (req/s):", static_cast<double>(r.n_ok) / r.duration);
  std::printf("%-40s %10.2f\n", "Output token throughput (tok/s):", out_rate);
  std::printf("%-40s %10.2f\n", "Total token throughput (tok/s):",
              static_cast<double>(r.n_in + r.n_out) / r.duration);
  auto block = [](const char* title, const char* name, const Summary& s) {
    std::printf("---------------%s---------------\n", title);
    std::printf("Mean %-35s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.mean * 1e3);
    std::printf("P50 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p50 * 1e3);
    std::printf("P90 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p90 * 1e3);
    std::printf("P99 %-36s %10.2f\n", (std::string(name) + " (ms):").c_str(), s.p99 * 1e3);
  };
  block("Time to First Token", "TTFT", r.ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", r.tpot);
  block("Inter-token Latency", "ITL", r.itl);
  block("End-to-end Latency", "E2E", r.e2e);
  std::printf("==================================================\n");
}

// "C:N,C:N": (concurrency, requests) pairs, each positive.
Result<std::vector<std::pair<int32_t, int32_t>>> parse_sweep(const std::string& text) {
  std::vector<std::pair<int32_t, int32_t>> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t colon = item.find(':');
    int32_t c = 0, n = 0;
    char rest = 0;
    if (colon == std::string::npos || std::sscanf(item.c_str(), "%d:%d%c", &c, &n, &rest) != 2 ||
        c < 1 || n < 1) {
      return make_error(StatusCode::kInvalidArgument,
                        "--sweep item '{}' is not CONCURRENCY:REQUESTS (both positive)", item);
    }
    out.emplace_back(c, n);
    at = comma + 1;
  }
  return out;
}

int run_bench(const BenchArgs& a) {
  const char* cmd = "bench";
  std::vector<std::pair<int32_t, int32_t>> runs = {{a.concurrency, a.workload.n_requests}};
  if (!a.sweep.empty()) {
    auto parsed = parse_sweep(a.sweep);
    if (!parsed.is_ok()) return fail(cmd, parsed.status());
    runs = std::move(parsed).value();
  }
  if (!a.base_url.empty()) {
    // An OpenAI-compatible server: one run (or the sweep) over HTTP.
    std::string model = a.model;
    if (model.empty()) {
      auto listed = http_first_model(a.base_url, a.api_key);
      if (!listed.is_ok()) return fail(cmd, listed.status());
      model = *listed;
    }
    bool complete = true;
    nlohmann::json all = nlohmann::json::array();
    for (const auto& [concurrency, n_requests] : runs) {
      BenchArgs one = a;
      one.concurrency = concurrency;
      one.workload.n_requests = n_requests;
      auto r = run_load_http(one, model, a.vocab_size);
      if (!r.is_ok()) return fail(cmd, r.status());
      complete = complete && r->n_ok == n_requests;
      if (a.json) {
        all.push_back(to_json(one, *r));
      } else {
        std::printf("Server: %s, model %s, concurrency %d\n", a.base_url.c_str(), model.c_str(),
                    concurrency);
        print_text(one, *r);
      }
    }
    if (a.json) std::printf("%s\n", (all.size() == 1 ? all[0] : all).dump(2).c_str());
    return complete ? 0 : 1;
  }
  auto endpoint = server_endpoint(a.server);
  if (!endpoint.is_ok()) return fail(cmd, endpoint.status());
  auto client = net::SchedulerClient::connect(*endpoint);
  if (!client.is_ok()) return fail(cmd, client.status());
  if (Status st = (*client)->wait_connected(kConnectTimeoutMs); !st) return fail(cmd, st);
  net::SchedulerClient& c = **client;
  if (Status st = c.wait_ready(30000); !st) return fail(cmd, st);
  auto info = c.server_info(5000);
  if (!info.is_ok()) return fail(cmd, info.status());
  const int32_t vocab = std::max(2, info->vocab_size);

  if (a.sweep.empty()) {
    auto r = run_load(c, a, vocab);
    if (!r.is_ok()) return fail(cmd, r.status());
    if (a.json) {
      std::printf("%s\n", to_json(a, *r).dump(2).c_str());
    } else {
      print_text(a, *r);
    }
    return r->n_ok == r->n_requests ? 0 : 1;
  }
  // The sweep: one markdown table (or one JSON array), every run against the same server.
  nlohmann::json all = nlohmann::json::array();
  bool complete = true;
  if (!a.json) {
    std::printf(
        "Server: %s on %s in %s; prompts of %d tokens, outputs of %d (random range %.2f)\n\n",
        info->model.c_str(), info->device.c_str(), info->dtype.c_str(), a.workload.input_len,
        a.workload.output_len, a.workload.range_ratio);
    std::printf(
        "| concurrency | requests | completed | output tok/s | total tok/s | TTFT p50 ms | TTFT "
        "p99 ms | TPOT p50 ms | TPOT p99 ms | ITL p99 ms |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const auto& [concurrency, n_requests] : runs) {
    BenchArgs one = a;
    one.concurrency = concurrency;
    one.workload.n_requests = n_requests;
    auto r = run_load(c, one, vocab);
    if (!r.is_ok()) return fail(cmd, r.status());
    complete = complete && r->n_ok == r->n_requests;
    if (a.json) {
      all.push_back(to_json(one, *r));
      continue;
    }
    std::printf("| %d | %d | %lld | %.0f | %.0f | %.2f | %.2f | %.3f | %.3f | %.2f |\n",
                concurrency, n_requests, static_cast<long long>(r->n_ok),
                static_cast<double>(r->n_out) / r->duration,
                static_cast<double>(r->n_in + r->n_out) / r->duration, r->ttft.p50 * 1e3,
                r->ttft.p99 * 1e3, r->tpot.p50 * 1e3, r->tpot.p99 * 1e3, r->itl.p99 * 1e3);
    for (const auto& [why, n] : r->errors) {
      std::fprintf(stderr, "bench: concurrency %d: %lld requests failed: %s\n", concurrency,
                   static_cast<long long>(n), why.c_str());
    }
    std::fflush(stdout);
  }
  if (a.json) std::printf("%s\n", all.dump(2).c_str());
  return complete ? 0 : 1;
}

}  // namespace

CommandMain register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "serving benchmark against a running scheduler");
  sub->add_option("--server", a->server, "scheduler address (default: litellama serve's)");
  add_bounded_option(*sub, "--num-requests,-n", a->workload.n_requests, "requests to send", 1,
                     1000000);
  sub->add_option("--concurrency,-c", a->concurrency, "requests in flight at most (0: no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--request-rate", a->request_rate, "Poisson arrivals per second (0: all at once)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_bounded_option(*sub, "--input-len", a->workload.input_len, "prompt tokens", 1, 1 << 20);
  CLI::Option* output_len = add_bounded_option(
      *sub, "--output-len", a->workload.output_len,
      "generated tokens (shared-prefix and multi-turn: 256 by default)", 1, 1 << 20);
  add_bounded_option(
      *sub, "--random-range-ratio", a->workload.range_ratio,
      "lengths uniform in [ratio * len, len] (1: fixed): random's prompts and outputs, "
      "multi-turn's questions and answers",
      0.0, 1.0);
  sub->add_option("--seed", a->workload.seed,
                  "seed of the random prompts, lengths and sampling seeds");
  sub->add_option("--temperature", a->workload.sampling.temperature, "of every request (0: greedy)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", a->workload.sampling.top_k, "of every request (0: off)")
      ->capture_default_str()
      ->check(non_negative("off"));
  add_bounded_option(*sub, "--top-p", a->workload.sampling.top_p, "of every request (1: off)", 0.0,
                     1.0);
  sub->add_option("--base-url", a->base_url,
                  "an OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) instead of the "
                  "scheduler: streaming /completions with token-id prompts and ignore_eos");
  sub->add_option("--api-key", a->api_key, "--base-url: sent as 'Authorization: Bearer KEY'");
  sub->add_option("--model", a->model, "--base-url: model to name (default: the first listed)");
  add_bounded_option(*sub, "--vocab-size", a->vocab_size,
                     "--base-url: prompt ids are drawn below this", 2, 1 << 24);
  sub->add_flag("--json", a->json, "print one JSON object (with --sweep: an array of them)");
  sub->add_option("--sweep", a->sweep,
                  "runs CONCURRENCY:REQUESTS,... one after the other against the same server and "
                  "prints one table (overrides -n and -c), e.g. 1:16,8:64,64:256,256:512");
  WorkloadOptions& w = a->workload;
  sub->add_option("--workload", w.kind,
                  "random, shared-prefix (groups of requests sharing a system prompt) or "
                  "multi-turn (each turn sends the whole conversation so far)")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "shared-prefix", "multi-turn"}));
  add_bounded_option(*sub, "--groups", w.groups, "shared-prefix: groups (system prompts)", 1,
                     1 << 16);
  add_bounded_option(*sub, "--prompts-per-group", w.prompts_per_group,
                     "shared-prefix: requests per group", 1, 1 << 16);
  add_bounded_option(*sub, "--system-len", w.system_len, "shared-prefix: system prompt tokens", 1,
                     1 << 20);
  add_bounded_option(*sub, "--question-len", w.question_len,
                     "shared-prefix and multi-turn: tokens of each question", 1, 1 << 20);
  add_bounded_option(*sub, "--conversations", w.conversations, "multi-turn: conversations", 1,
                     1 << 16);
  add_bounded_option(*sub, "--turns", w.turns, "multi-turn: turns per conversation", 1, 1024);
  sub->add_option("--priority", a->priority, "scheduling priority of every request (larger first)")
      ->capture_default_str();
  return [a, output_len] {
    if (a->workload.kind != "random" && output_len->count() == 0) a->workload.output_len = 256;
    return run_bench(*a);
  };
}

}  // namespace litellama::cli
