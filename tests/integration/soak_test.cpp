// Soak: the three services on the CPU backend under sustained mixed load for a bounded time
// (LITELLAMA_SOAK_SECONDS, 60 by default; LITELLAMA_SOAK_CONCURRENCY requests outstanding, 64 by
// default). Client threads keep requests of random prompt and output lengths outstanding (token
// ids, text and chat prompts, greedy and sampled), abort some after their first chunk, send
// requests the scheduler must refuse, drop whole connections mid-stream and send malformed
// frames; mid-run the worker and then the tokenizer are killed (SIGKILL) and started again.
//
// What it proves:
//   - a ledger per connection: every request the client submitted ended in exactly one final
//     chunk or one error, no event arrived for an unknown or already finished request, chunk
//     counts add up, and every request that had to be refused got an error, not an answer;
//   - the service recovered: requests submitted after the last restart were answered;
//   - after the load, the scheduler's KV and request gauges are back to 0; the open fds of each
//     service and the /dev/shm step rings are back to their idle baseline (a restarted service
//     is compared with the first one); the resident memory of each process is within 10% of its
//     own after warm-up.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/proto/client_messages.h"
#include "common/proto/codec.h"
#include "service_cluster.h"

namespace litellama {
namespace {

// GCC names its sanitizers with __SANITIZE_*__; clang 14 only through __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LITELLAMA_SOAK_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    defined(LITELLAMA_SOAK_SANITIZED)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif

using Clock = std::chrono::steady_clock;
using testing::metric_value;
using testing::ServiceCluster;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

// Open file descriptors of a process.
int fd_count(pid_t pid) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// Resident set size of a process in KiB (-1 when it is gone).
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// /dev/shm entries whose name holds `pid` as a '-'-separated field (the worker's step ring is
// named litellama-step-<pid>-<incarnation>).
std::set<std::string> shm_entries_of(pid_t pid) {
  std::set<std::string> out;
  const std::string field = "-" + std::to_string(pid);
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const size_t at = name.find(field);
    if (at == std::string::npos) continue;
    const size_t end = at + field.size();
    if (end == name.size() || name[end] == '-') out.insert(name);
  }
  closedir(d);
  return out;
}

// What the driver expects of one request.
enum class Plan { kNormal, kAbortAfterFirstChunk, kMustBeRefused };

struct Entry {
  Plan plan = Plan::kNormal;
  int32_t max_tokens = 0;
  Clock::time_point submitted;
  size_t n_tokens = 0;   // ids streamed
  size_t n_counted = 0;  // the last chunk's n_generated_tokens
  int n_ends = 0;
  bool aborted = false;
  bool error = false;
  std::string how;  // finish_reason or error code
};

// Every event of one connection, checked as it arrives.
class Ledger {
 public:
  void submitted(uint64_t id, Entry entry) {
    if (!entries_.emplace(id, std::move(entry)).second) return violation(id, "request id reused");
    ++n_open_;
  }
  Entry* find(uint64_t id) {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void on_event(const net::ClientEvent& e) {
    const uint64_t id = e.request_id();
    Entry* r = find(id);
    if (r == nullptr) return violation(id, "event for a request never submitted");
    if (r->n_ends > 0) violation(id, "event after the request's end (" + r->how + ")");
    if (e.kind == net::ClientEvent::Kind::kError) {
      if (++r->n_ends == 1) --n_open_;
      r->error = true;
      r->how = e.error.code;
      return;
    }
    const proto::GenerateChunk& c = e.chunk;
    r->n_tokens += c.token_ids.size();
    // Ids go out with their text, so a chunk may count ids that follow later; the final chunk
    // carries the rest.
    const size_t n_counted = static_cast<size_t>(std::max(0, c.n_generated_tokens));
    if (n_counted < r->n_tokens || n_counted < r->n_counted ||
        (c.finished && n_counted != r->n_tokens)) {
      violation(id, "n_generated_tokens " + std::to_string(c.n_generated_tokens) + " after " +
                        std::to_string(r->n_tokens) + " ids streamed" +
                        (c.finished ? " (final chunk)" : ""));
    }
    r->n_counted = n_counted;
    if (r->n_tokens > static_cast<size_t>(r->max_tokens)) violation(id, "more than max_tokens");
    if (r->plan == Plan::kMustBeRefused) violation(id, "a request that must be refused streamed");
    if (!c.finished) return;
    if (++r->n_ends == 1) --n_open_;
    r->how = c.finish_reason;
    if (c.finish_reason != "stop" && c.finish_reason != "length" && c.finish_reason != "abort") {
      violation(id, "unknown finish_reason '" + c.finish_reason + "'");
    }
    if (c.finish_reason == "abort" && !r->aborted) violation(id, "aborted without an abort");
  }
  size_t open() const { return n_open_; }
  // At the end: every request ended exactly once.
  void close() {
    for (const auto& [id, r] : entries_) {
      if (r.n_ends == 0) violation(id, "no answer and no error");
      if (r.plan == Plan::kMustBeRefused && !r.error) violation(id, "not refused");
    }
  }
  const std::map<uint64_t, Entry>& entries() const { return entries_; }
  const std::vector<std::string>& violations() const { return violations_; }

 private:
  void violation(uint64_t id, const std::string& what) {
    if (violations_.size() < 50)
      violations_.push_back("request " + std::to_string(id) + ": " + what);
  }
  std::map<uint64_t, Entry> entries_;
  size_t n_open_ = 0;  // entries without an end
  std::vector<std::string> violations_;
};

// Random words, with some non-ASCII text.
std::string random_text(std::mt19937_64& rng, int n_words) {
  static const char* kWords[] = {"the", "model", "é",  "日本",  "serves", "tokens", "😀",    "fast",
                                 "\n",  "  ",    "KV", "cache", "stream", "Привет", "1234", "?"};
  std::string out;
  for (int i = 0; i < n_words; ++i) {
    out += kWords[rng() % std::size(kWords)];
    out += ' ';
  }
  return out;
}

// A request of the given plan with random lengths and options.
proto::GenerateRequest make_request(std::mt19937_64& rng, Plan plan) {
  proto::GenerateRequest r;
  r.max_tokens = 1 + static_cast<int32_t>(rng() % 48);
  r.ignore_eos = rng() % 2 == 0;
  if (rng() % 3 == 0) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.seed = rng();
  }
  switch (rng() % 4) {
    case 0:
      r.prompt = random_text(rng, 1 + static_cast<int>(rng() % 60));
      break;
    case 1:
      r.messages = {{"system", "Be brief."},
                    {"user", random_text(rng, 1 + static_cast<int>(rng() % 20))}};
      break;
    default: {
      const size_t n = 1 + rng() % 160;
      for (size_t i = 0; i < n; ++i)
        r.prompt_ids.push_back(1 + static_cast<int32_t>(rng() % 127999));
    }
  }
  if (plan == Plan::kAbortAfterFirstChunk) {
    r.max_tokens = 200;
    r.ignore_eos = true;
  }
  if (plan == Plan::kMustBeRefused) {
    r.prompt_ids = {10, 20, 30};
    switch (rng() % 6) {
      case 0:
        r.max_tokens = 0;
        break;
      case 1:
        r.prompt_ids.push_back(999999999);
        break;  // outside the vocabulary
      case 2:
        r.prompt_ids.push_back(-5);
        break;  // negative id
      case 3:
        r.top_logits = 1000;
        break;
      case 4:
        r.max_tokens = 100000;
        break;  // longer than the KV pool
      default:
        r.sampling.top_p = 0.0f;
        break;
    }
  }
  return r;
}

struct DriverResult {
  Ledger ledger;
  std::vector<std::string> errors;  // client-side failures (not ledger violations)
};

// One connection keeping `outstanding` requests open until `stop_at`, then draining.
void drive(ServiceCluster* cluster, int outstanding, Clock::time_point stop_at,
           Clock::time_point drain_by, uint64_t seed, DriverResult* out) {
  std::mt19937_64 rng(seed);
  auto client = cluster->client();
  if (!client) {
    out->errors.push_back("cannot connect");
    return;
  }
  Ledger& ledger = out->ledger;
  while (true) {
    const auto now = Clock::now();
    if (now >= stop_at && ledger.open() == 0) break;
    if (now >= drain_by) {
      out->errors.push_back(std::to_string(ledger.open()) + " requests still open at the end");
      break;
    }
    while (now < stop_at && ledger.open() < static_cast<size_t>(outstanding)) {
      const uint64_t roll = rng() % 100;
      const Plan plan = roll < 80   ? Plan::kNormal
                        : roll < 90 ? Plan::kAbortAfterFirstChunk
                                    : Plan::kMustBeRefused;
      proto::GenerateRequest request = make_request(rng, plan);
      Entry entry;
      entry.plan = plan;
      entry.max_tokens = std::max<int32_t>(request.max_tokens, 0);
      entry.submitted = now;
      auto id = client->submit(std::move(request));
      if (!id.is_ok()) {
        out->errors.push_back("submit failed: " + id.status().to_string());
        return;
      }
      ledger.submitted(*id, entry);
    }
    auto event = client->next_event(20);
    if (!event.is_ok()) {
      out->errors.push_back("next_event failed: " + event.status().to_string());
      return;
    }
    if (!*event) continue;
    ledger.on_event(**event);
    Entry* r = ledger.find((*event)->request_id());
    if (r != nullptr && r->plan == Plan::kAbortAfterFirstChunk && !r->aborted && r->n_ends == 0) {
      r->aborted = true;
      if (Status st = client->abort((*event)->request_id()); !st) {
        out->errors.push_back("abort failed: " + st.to_string());
      }
    }
  }
  ledger.close();
}

// Connections that submit long requests, read a little and go away.
void disconnect_loop(ServiceCluster* cluster, Clock::time_point stop_at, uint64_t seed,
                     std::atomic<int>* n_dropped) {
  std::mt19937_64 rng(seed);
  while (Clock::now() < stop_at) {
    {
      auto client = cluster->client();
      if (!client) return;
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < n; ++i) {
        proto::GenerateRequest r;
        r.prompt_ids = {100, 200, 300 + static_cast<int32_t>(rng() % 1000)};
        r.max_tokens = 300;
        r.ignore_eos = true;
        if (client->submit(r).is_ok()) ++*n_dropped;
      }
      (void)client->next_event(static_cast<int>(rng() % 1500));
    }  // the connection closes with its requests open
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 800));
  }
}

// Malformed frames on the client socket: random bytes and damaged valid requests.
void garbage_loop(const std::string& endpoint, Clock::time_point stop_at, uint64_t seed,
                  std::atomic<int>* n_sent) {
  std::mt19937_64 rng(seed);
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, 100);
  s.connect(endpoint);
  proto::GenerateRequest valid;
  valid.request_id = 1;
  valid.prompt_ids = {1, 2, 3};
  valid.max_tokens = 2;
  const std::string good = proto::encode(valid);
  while (Clock::now() < stop_at) {
    std::string frame;
    switch (rng() % 3) {
      case 0:
        for (size_t i = 0, n = rng() % 64; i < n; ++i) frame.push_back(static_cast<char>(rng()));
        break;
      case 1:
        frame = good.substr(0, rng() % good.size());  // truncated
        break;
      default:
        frame = good;
        frame[rng() % frame.size()] = static_cast<char>(rng());  // one byte damaged
    }
    if (s.send(zmq::buffer(frame), zmq::send_flags::dontwait)) ++*n_sent;
    // Answers to frames that still decode are read and dropped.
    zmq::message_t m;
    while (s.recv(m, zmq::recv_flags::dontwait)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 200));
  }
}

struct Baseline {
  int fds = 0;
  long rss = 0;
};

// Polls `ok` until it holds or timeout_ms passed.
template <typename F>
bool eventually(F ok, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!ok()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

TEST(Soak, MixedLoadWithRestartsEndsCleanly) {
  const int seconds = env_int("LITELLAMA_SOAK_SECONDS", 60);
  const int concurrency = env_int("LITELLAMA_SOAK_CONCURRENCY", 64);
  constexpr int kDrivers = 4;
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  // One request end to end first, so every service has served before the baseline is taken.
  {
    auto c = cluster.client();
    proto::GenerateRequest r;
    r.prompt = "warm up";
    r.max_tokens = 4;
    ASSERT_TRUE(c->generate(r, nullptr, 30000).is_ok()) << cluster.logs();
  }
  std::map<std::string, Baseline> idle;
  for (const char* name : {"scheduler", "worker", "tokenizer"}) {
    idle[name].fds = fd_count(cluster.process(name).pid());
    ASSERT_GT(idle[name].fds, 0) << name;
  }
  const pid_t first_worker = cluster.process("worker").pid();
  const std::set<std::string> idle_rings = shm_entries_of(first_worker);
  ASSERT_FALSE(idle_rings.empty()) << "no /dev/shm entry named after the worker's pid "
                                   << first_worker << ": has the step ring's name changed?";

  const auto start = Clock::now();
  auto at = [&](double fraction) {
    return start + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 * fraction));
  };
  const auto stop_at = at(1.0);
  const auto drain_by = stop_at + std::chrono::seconds(90);
  std::vector<DriverResult> results(kDrivers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kDrivers; ++i) {
    threads.emplace_back(drive, &cluster, std::max(1, concurrency / kDrivers), stop_at, drain_by,
                         1000 + i, &results[i]);
  }
  std::atomic<int> n_dropped{0}, n_garbage{0};
  threads.emplace_back(disconnect_loop, &cluster, stop_at, 7, &n_dropped);
  threads.emplace_back(garbage_loop, cluster.endpoint("client"), stop_at, 9, &n_garbage);

  // Timeline: resident-memory baselines after warm-up under load, the worker killed and started
  // again, its baseline, the tokenizer killed and started again, its baseline.
  std::map<std::string, Baseline> warm;
  auto take_rss = [&](const std::string& name) {
    warm[name].rss = rss_kib(cluster.process(name).pid());
  };
  std::this_thread::sleep_until(at(0.2));
  for (const char* name : {"scheduler", "worker", "tokenizer"}) take_rss(name);
  std::this_thread::sleep_until(at(0.35));
  cluster.process("worker").signal(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(cluster.start_worker());
  std::this_thread::sleep_until(at(0.55));
  take_rss("worker");
  cluster.process("tokenizer").signal(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(cluster.start_tokenizer());
  const auto last_restart = Clock::now();
  std::this_thread::sleep_until(at(0.75));
  take_rss("tokenizer");
  for (auto& t : threads) t.join();

  // The ledger.
  size_t n_requests = 0, n_answered = 0, n_errors = 0, n_refused = 0, n_aborted = 0;
  size_t n_answered_after_restarts = 0;
  std::map<std::string, int> error_codes;
  for (auto& r : results) {
    for (const auto& e : r.errors) ADD_FAILURE() << "driver: " << e;
    for (const auto& v : r.ledger.violations()) ADD_FAILURE() << "ledger: " << v;
    for (const auto& [id, e] : r.ledger.entries()) {
      ++n_requests;
      if (e.plan == Plan::kMustBeRefused) {
        n_refused += e.error;
        continue;
      }
      if (e.error) {
        ++n_errors;
        ++error_codes[e.how];
      } else {
        ++n_answered;
        n_aborted += e.how == "abort";
        if (e.submitted > last_restart + std::chrono::seconds(2)) ++n_answered_after_restarts;
      }
    }
  }
  std::string codes;
  for (const auto& [code, n] : error_codes) codes += code + ":" + std::to_string(n) + " ";
  std::printf(
      "soak: %d s, %zu requests: %zu answered (%zu aborted), %zu errors (%s), %zu refused; "
      "%d on dropped connections, %d malformed frames\n",
      seconds, n_requests, n_answered, n_aborted, n_errors, codes.c_str(), n_refused,
      n_dropped.load(), n_garbage.load());
  EXPECT_GT(n_answered, 20u);
  EXPECT_GT(n_aborted, 0u);
  EXPECT_GT(n_refused, 0u);
  EXPECT_GT(n_answered_after_restarts, 0u) << "nothing was answered after the restarts";
  for (const char* name : {"scheduler", "worker", "tokenizer"}) {
    EXPECT_TRUE(cluster.process(name).running()) << name << " died\n" << cluster.logs();
  }

  // Back to the baseline once idle.
  for (const char* gauge :
       {"litellama_scheduler_kv_slots_used", "litellama_scheduler_requests_running",
        "litellama_scheduler_requests_waiting"}) {
    EXPECT_TRUE(cluster.wait_metric(gauge, 0, 15000))
        << gauge << " = " << metric_value(cluster.scheduler_metrics(), gauge);
  }
  for (const char* name : {"scheduler", "worker", "tokenizer"}) {
    const pid_t pid = cluster.process(name).pid();
    EXPECT_TRUE(eventually([&] { return fd_count(pid) <= idle[name].fds; }, 10000))
        << name << ": " << fd_count(pid) << " open fds, " << idle[name].fds << " at idle before";
    const long rss = rss_kib(pid);
    if (kSanitizedBuild) {
      // A sanitizer's own memory (ASan's quarantine of freed blocks, TSan's shadow and history)
      // grows with the work done, so resident size says nothing about ours there; leaks are
      // LeakSanitizer's to find in that build.
      std::printf(
          "soak: %s resident %ld KiB (%ld after warm-up), not compared in a sanitizer "
          "build\n",
          name, rss, warm[name].rss);
      continue;
    }
    EXPECT_LE(rss, warm[name].rss + warm[name].rss / 10)
        << name << ": resident " << rss << " KiB, " << warm[name].rss << " KiB after warm-up";
  }
  EXPECT_TRUE(eventually([&] { return shm_entries_of(first_worker).empty(); }, 10000))
      << "the killed worker's step ring was not removed from /dev/shm";
  EXPECT_EQ(shm_entries_of(cluster.process("worker").pid()).size(), idle_rings.size());
}

}  // namespace
}  // namespace litellama
