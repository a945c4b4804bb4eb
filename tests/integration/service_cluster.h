// ServiceCluster: the three service processes on a private run directory, for the integration
// tests. Builds a tiny random Llama 3 checkpoint with the real tokenizer, picks free metrics
// ports, and uses short heartbeats so failures are seen within a fraction of a second.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/net/child_process.h"
#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"
#include "services/worker/random_checkpoint.h"
#include "tests/integration/http_client.h"

namespace litellama::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

// A loopback port free now, for a service to bind later. Drawn from [20000, 32000), below
// Linux's ephemeral range (32768 up): a port the kernel hands out itself (bind to 0) can be taken
// by any test's outgoing connection before the service binds it, which made parallel tests fail
// with "already in use". Each candidate is bound once to check it is free.
inline int free_tcp_port() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> pick(20000, 31999);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  // Every draw taken: the kernel's choice.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// GET http://127.0.0.1:port/path; returns {status, body} ({0, ""} when unreachable).
inline std::pair<int, std::string> http_get(int port, const std::string& path) {
  const int fd = connect_local(port);
  if (fd < 0) return {0, ""};
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t sp = response.find(' ');
  const size_t body = response.find("\r\n\r\n");
  if (sp == std::string::npos || body == std::string::npos) return {0, ""};
  return {std::atoi(response.c_str() + sp + 1), response.substr(body + 4)};
}

// Calls `done` every 20 ms until it returns true or timeout_ms pass; its last answer.
template <typename Done>
bool poll_until(Done&& done, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// A request for exactly max_tokens tokens after the prompt ids (EOS ignored).
inline proto::GenerateRequest ignoring_eos_request(std::vector<int32_t> prompt_ids,
                                                   int32_t max_tokens) {
  proto::GenerateRequest r;
  r.prompt_ids = std::move(prompt_ids);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Submits n requests with the prompts {100, 200, 300 + i} that ignore EOS and generate
// max_tokens tokens each; their ids in order.
inline std::vector<uint64_t> submit_ignoring_eos(net::SchedulerClient& client, int n,
                                                 int32_t max_tokens) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(client.submit(ignoring_eos_request({100, 200, 300 + i}, max_tokens)).value());
  }
  return ids;
}

// Value of one series ("name" or "name{labels}") in a Prometheus text body; -1 when absent.
inline double metric_value(const std::string& body, const std::string& series) {
  size_t pos = 0;
  while ((pos = body.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || body[pos - 1] == '\n') return std::atof(body.c_str() + pos + series.size());
    pos += series.size();
  }
  return -1;
}

class ServiceCluster {
 public:
  ServiceCluster() {
    bin_ = env_or("LITELLAMA_BIN_DIR", net::executable_dir() + "/../bin");
    source_ = env_or("LITELLAMA_SOURCE_DIR", ".");
    dir_ = std::filesystem::temp_directory_path() /
           ("litellama-it-" + std::to_string(getpid()) + "-" + std::to_string(net::random_id()));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "model").string();
    run_ = (dir_ / "run").string();
    scheduler_port_ = free_tcp_port();
    worker_port_ = free_tcp_port();
    tokenizer_port_ = free_tcp_port();
    vision_port_ = free_tcp_port();
  }
  ~ServiceCluster() {
    for (auto& [name, p] : processes_) p.stop(2000);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // The random-weight preset make_model() writes (before start_all()).
  void use_preset(const std::string& name) { preset_ = name; }
  // Writes the test model (llama3-tiny with the Llama 3.1 tokenizer, or use_preset's).
  void make_model() {
    auto preset = find_random_checkpoint_preset(preset_);
    ASSERT_TRUE(preset.is_ok()) << preset.status().to_string();
    RandomCheckpointOptions options;
    options.seed = 7;
    options.tokenizer_dir = source_ + "/assets/tokenizers/" + preset->tokenizer;
    ASSERT_TRUE(std::filesystem::exists(options.tokenizer_dir + "/tokenizer.json"))
        << "tokenizer assets missing: run scripts/fetch-assets.sh";
    Status st = write_random_checkpoint(model_, preset->config, options);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }

  void start_scheduler() {
    std::vector<std::string> argv = {bin_ + "/litellama-scheduler",
                                     "--run-dir",
                                     run_,
                                     "--metrics",
                                     "127.0.0.1:" + std::to_string(scheduler_port_),
                                     "--heartbeat-ms",
                                     "50",
                                     "--peer-timeout-ms",
                                     "600",
                                     "--peer-wait-ms",
                                     "20000",
                                     "--max-batch-tokens",
                                     "512",
                                     "--max-batch-seqs",
                                     "32"};
    argv.insert(argv.end(), scheduler_args_.begin(), scheduler_args_.end());
    start("scheduler", argv);
  }
  // Flags appended to the scheduler's command line, before start_scheduler().
  void add_scheduler_args(const std::vector<std::string>& args) {
    scheduler_args_.insert(scheduler_args_.end(), args.begin(), args.end());
  }
  // The worker's command line as start_worker() runs it, with another metrics port.
  std::vector<std::string> worker_argv(int metrics_port) const {
    std::vector<std::string> argv = {bin_ + "/litellama-worker",
                                     "--model",
                                     model_,
                                     "--run-dir",
                                     run_,
                                     "--metrics",
                                     "127.0.0.1:" + std::to_string(metrics_port),
                                     "--kv-slots",
                                     std::to_string(kKvSlots),
                                     "--threads",
                                     "1",
                                     "--heartbeat-ms",
                                     "50",
                                     "--peer-timeout-ms",
                                     "600",
                                     "--max-batch-tokens",
                                     "512",
                                     "--max-batch-seqs",
                                     "32"};
    argv.insert(argv.end(), worker_args_.begin(), worker_args_.end());
    return argv;
  }
  // Starts any program under `name` (its log is dir()/name.log); see log(name).
  void start_process(const std::string& name, const std::vector<std::string>& argv) {
    start(name, argv);
  }
  std::string log(const std::string& name) const {
    std::ifstream f(dir_ / (name + ".log"));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  const std::string& run_dir() const { return run_; }
  void start_worker() { start("worker", worker_argv(worker_port_)); }
  // Flags appended to the worker's command line (e.g. --device cuda), before start_worker().
  void add_worker_args(const std::vector<std::string>& args) {
    worker_args_.insert(worker_args_.end(), args.begin(), args.end());
  }
  void start_tokenizer() {
    start("tokenizer", {bin_ + "/litellama-tokenizer", "--model", model_, "--run-dir", run_,
                        "--metrics", "127.0.0.1:" + std::to_string(tokenizer_port_),
                        "--heartbeat-ms", "50", "--peer-timeout-ms", "600"});
  }
  // The vision service (LLaVA presets), two encoder threads, the pool sized for `pool_bytes`.
  void start_vision(int64_t pool_bytes = 64 << 10) {
    std::vector<std::string> argv = {bin_ + "/litellama-vision",
                                     "--model",
                                     model_,
                                     "--run-dir",
                                     run_,
                                     "--metrics",
                                     "127.0.0.1:" + std::to_string(vision_port_),
                                     "--threads",
                                     "2",
                                     "--vision-pool-bytes",
                                     std::to_string(pool_bytes),
                                     "--heartbeat-ms",
                                     "50",
                                     "--peer-timeout-ms",
                                     "600"};
    argv.insert(argv.end(), vision_args_.begin(), vision_args_.end());
    start("vision", argv);
  }
  // The scheduler, worker, tokenizer and vision service (LLaVA presets, after make_model()); waits
  // until the scheduler has the vision service.
  void start_with_vision(int64_t pool_bytes = 64 << 10) {
    start_scheduler();
    start_worker();
    start_tokenizer();
    start_vision(pool_bytes);
    ASSERT_NO_FATAL_FAILURE(wait_ready());
    auto c = client();
    ASSERT_TRUE(poll_until(
        [&] {
          auto info = c->server_info(1000);
          return info.is_ok() && info->vision_up;
        },
        30000))
        << logs();
  }
  // Flags appended to the vision service's command line (e.g. --device cuda).
  void add_vision_args(const std::vector<std::string>& args) {
    vision_args_.insert(vision_args_.end(), args.begin(), args.end());
  }
  int vision_metrics_port() const { return vision_port_; }
  // Images the vision service has encoded (litellama_vision_encodes_total), -1 when unreachable.
  double vision_encodes() const {
    const auto [status, body] = http_get(vision_port_, "/metrics");
    return status == 200 ? metric_value(body, "litellama_vision_encodes_total") : -1;
  }
  void start_all() {
    make_model();
    start_scheduler();
    start_worker();
    start_tokenizer();
    wait_ready();
  }
  void wait_ready() {
    auto c = client();
    Status st = c->wait_ready(30000);
    ASSERT_TRUE(st.is_ok()) << st.to_string() << "\n" << logs();
  }

  net::ChildProcess& process(const std::string& name) { return processes_.at(name); }

  std::unique_ptr<net::SchedulerClient> client() {
    auto c = net::SchedulerClient::connect(net::ipc_endpoint(run_, "client"));
    EXPECT_TRUE(c.is_ok());
    return std::move(c).value();
  }
  std::string endpoint(const std::string& name) const { return net::ipc_endpoint(run_, name); }
  const std::string& model_dir() const { return model_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& bin_dir() const { return bin_; }
  int scheduler_port() const { return scheduler_port_; }
  int worker_port() const { return worker_port_; }
  int tokenizer_port() const { return tokenizer_port_; }
  std::string worker_metrics() const { return http_get(worker_port_, "/metrics").second; }
  std::string scheduler_metrics() const { return http_get(scheduler_port_, "/metrics").second; }

  // Polls the scheduler's metrics until `series` equals `value` (within timeout_ms).
  // Whether the scheduler's series exceeds `value` within the timeout (its gauges refresh at
  // most ten times a second while requests run).
  bool wait_metric_above(const std::string& series, double value, int timeout_ms = 2000) const {
    return poll_until([&] { return metric_value(scheduler_metrics(), series) > value; },
                      timeout_ms);
  }
  bool wait_metric(const std::string& series, double value, int timeout_ms = 5000) const {
    return poll_until([&] { return metric_value(scheduler_metrics(), series) == value; },
                      timeout_ms);
  }

  std::string logs() const {
    std::string out;
    for (const char* name : {"scheduler", "worker", "tokenizer"}) {
      std::ifstream f(dir_ / (std::string(name) + ".log"));
      std::stringstream ss;
      ss << f.rdbuf();
      std::string s = ss.str();
      if (s.size() > 4000) s = s.substr(s.size() - 4000);
      out += std::string("---- ") + name + "\n" + s;
    }
    return out;
  }

  static constexpr int32_t kKvSlots = 2048;

 private:
  void start(const std::string& name, const std::vector<std::string>& argv) {
    // A restart waits until the process it replaces is gone: a killed process closes its sockets
    // only after its address space is torn down (slow for a sanitizer's large mappings), and the
    // new one must bind the same metrics port.
    if (auto old = processes_.find(name); old != processes_.end()) old->second.stop(5000);
    auto p = net::ChildProcess::spawn(argv, (dir_ / (name + ".log")).string());
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    processes_[name] = std::move(p).value();
  }

  std::string bin_, source_;
  std::filesystem::path dir_;
  std::string model_, run_;
  std::vector<std::string> worker_args_;
  std::vector<std::string> vision_args_;
  std::vector<std::string> scheduler_args_;
  int scheduler_port_ = 0, worker_port_ = 0, tokenizer_port_ = 0, vision_port_ = 0;
  std::string preset_ = "llama3-tiny";
  std::map<std::string, net::ChildProcess> processes_;
};

}  // namespace litellama::testing
