#include "cli/service_launcher.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"

namespace litellama::cli {

ServiceLauncher::ServiceLauncher(LaunchOptions options) : options_(std::move(options)) {}

ServiceLauncher::~ServiceLauncher() {
  stop_all();
}

Status ServiceLauncher::launch(Service& s) {
  std::string log;
  if (!options_.log_dir.empty()) log = options_.log_dir + "/" + s.name + ".log";
  LITELLAMA_ASSIGN_OR_RETURN(s.process, net::ChildProcess::spawn(s.argv, log));
  return Status::ok();
}

Status ServiceLauncher::start() {
  const std::string bin = net::executable_dir();
  for (const char* name : {"litellama-scheduler", "litellama-worker", "litellama-tokenizer"}) {
    if (!std::filesystem::exists(bin + "/" + name)) {
      return make_error(StatusCode::kNotFound, "{} is not next to this executable in {}", name,
                        bin);
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.run_dir, ec);
  if (!options_.log_dir.empty()) std::filesystem::create_directories(options_.log_dir, ec);
  client_endpoint_ = options_.client_endpoint.empty()
                         ? net::ipc_endpoint(options_.run_dir, "client")
                         : options_.client_endpoint;
  auto metrics = [&](int offset) {
    return options_.metrics_port > 0
               ? fmt::format("{}:{}", options_.metrics_host, options_.metrics_port + offset)
               : std::string();
  };
  const std::string worker_ep = net::ipc_endpoint(options_.run_dir, "worker");
  const std::string tokenizer_ep = net::ipc_endpoint(options_.run_dir, "tokenizer");
  services_.clear();
  services_.push_back(
      {"scheduler",
       {bin + "/litellama-scheduler", "--client-endpoint", client_endpoint_, "--worker-endpoint",
        worker_ep, "--tokenizer-endpoint", tokenizer_ep, "--metrics", metrics(0), "--log-level",
        options_.log_level, "--max-batch-tokens", std::to_string(options_.max_batch_tokens),
        "--max-batch-seqs", std::to_string(options_.max_batch_seqs)},
       {},
       0});
  services_.push_back(
      {"worker",
       {bin + "/litellama-worker", "--model", options_.model_dir, "--device", options_.device,
        "--scheduler", worker_ep, "--metrics", metrics(1), "--log-level", options_.log_level,
        "--kv-slots", std::to_string(options_.kv_slots), "--threads",
        std::to_string(options_.threads), "--max-batch-tokens",
        std::to_string(options_.max_batch_tokens), "--max-batch-seqs",
        std::to_string(options_.max_batch_seqs)},
       {},
       0});
  for (int32_t i = 0; i < options_.n_tokenizers; ++i) {
    services_.push_back(
        {fmt::format("tokenizer-{}", i),
         {bin + "/litellama-tokenizer", "--model", options_.model_dir, "--scheduler", tokenizer_ep,
          "--metrics", metrics(2 + i), "--log-level", options_.log_level},
         {},
         0});
  }
  for (Service& s : services_) LITELLAMA_RETURN_IF_ERROR(launch(s));
  return Status::ok();
}

Status ServiceLauncher::wait_ready(int timeout_ms) {
  LITELLAMA_ASSIGN_OR_RETURN(auto client, net::SchedulerClient::connect(client_endpoint_));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    for (Service& s : services_) {
      if (auto code = s.process.poll(); code && !options_.restart) {
        return make_error(StatusCode::kUnavailable, "{} exited with status {}", s.name, *code);
      }
    }
    if (client->wait_ready(500).is_ok()) return Status::ok();
  }
  return make_error(StatusCode::kUnavailable, "the services were not ready after {} ms",
                    timeout_ms);
}

void ServiceLauncher::supervise(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    for (Service& s : services_) {
      auto code = s.process.poll();
      if (!code || !options_.restart || stop.load()) continue;
      ++s.n_restarts;
      std::fprintf(stderr, "litellama serve: %s exited with status %d; restarting (%d)\n",
                   s.name.c_str(), *code, s.n_restarts);
      // Back off a little when a service keeps dying.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5000, 200 * s.n_restarts)));
      if (Status st = launch(s); !st) {
        std::fprintf(stderr, "litellama serve: %s\n", st.to_string().c_str());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void ServiceLauncher::stop_all() {
  // Peers first, so the scheduler answers its clients while it still can.
  for (size_t i = services_.size(); i-- > 1;) services_[i].process.signal(SIGTERM);
  for (size_t i = services_.size(); i-- > 1;) services_[i].process.stop(5000);
  if (!services_.empty()) services_[0].process.stop(5000);
  services_.clear();
}

}  // namespace litellama::cli
