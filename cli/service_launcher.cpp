#include "cli/service_launcher.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/net/metrics_server.h"
#include "common/net/run_dir.h"
#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"
#include "services/worker/llava_config.h"

namespace litellama::cli {

namespace {

// A child that exits this soon after a start, this many times in a row, is not restarted again.
constexpr double kQuickExitSeconds = 10.0;
constexpr int32_t kMaxQuickExits = 5;

std::string log_tail(const std::string& path, size_t n_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    lines.push_back(std::move(line));
    if (lines.size() > n_lines) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& line : lines) out += "\n  " + line;
  return out;
}

}  // namespace

ServiceLauncher::ServiceLauncher(LaunchOptions options) : options_(std::move(options)) {}

ServiceLauncher::~ServiceLauncher() {
  stop_all();
}

Status ServiceLauncher::launch(Service& s) {
  std::string log;
  if (!options_.log_dir.empty()) log = options_.log_dir + "/" + s.name + ".log";
  LITELLAMA_ASSIGN_OR_RETURN(s.process, net::ChildProcess::spawn(s.argv, log));
  s.started = std::chrono::steady_clock::now();
  return Status::ok();
}

std::string ServiceLauncher::describe_exit(const Service& s, int code, const char* when) const {
  std::string what = fmt::format("{} exited with status {}{}", s.name, code, when);
  if (code == net::kExitConfigError) what += " (its configuration cannot work; not restarted)";
  if (!options_.log_dir.empty()) {
    const std::string tail = log_tail(options_.log_dir + "/" + s.name + ".log", 5);
    if (!tail.empty()) what += "; the end of " + s.name + ".log:" + tail;
  }
  return what;
}

std::string ServiceLauncher::api_listen() const {
  if (options_.api_port <= 0) return "";
  return options_.api_host.find(':') != std::string::npos
             ? fmt::format("[{}]:{}", options_.api_host, options_.api_port)
             : fmt::format("{}:{}", options_.api_host, options_.api_port);
}

Status ServiceLauncher::add_api_flags(std::vector<std::string>* argv) {
  if (options_.max_model_len > 0) {
    argv->insert(argv->end(), {"--max-model-len", std::to_string(options_.max_model_len)});
  }
  if (options_.api_port <= 0) return Status::ok();
  argv->insert(argv->end(), {"--api-listen", api_listen(), "--max-request-bytes",
                             std::to_string(options_.max_request_bytes)});
  argv->insert(argv->end(),
               {"--max-image-request-bytes", std::to_string(options_.max_image_request_bytes)});
  if (!options_.allowed_local_media_path.empty()) {
    argv->insert(argv->end(),
                 {"--allowed-local-media-path",
                  std::filesystem::absolute(options_.allowed_local_media_path).string()});
  }
  if (!options_.served_model_name.empty()) {
    argv->insert(argv->end(), {"--served-model-name", options_.served_model_name});
  }
  std::string key_file = options_.api_key_file;
  if (!options_.api_key.empty()) {
    // The key goes to the scheduler in a file only this user can read (a command line is
    // visible to every user of the machine).
    key_file = options_.run_dir + "/api-key";
    std::filesystem::remove(key_file);
    std::ofstream out(key_file);
    out << options_.api_key << "\n";
    out.close();
    std::error_code ec;
    std::filesystem::permissions(
        key_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write, ec);
    if (!out || ec) return make_error(StatusCode::kUnavailable, "cannot write {}", key_file);
  }
  if (!key_file.empty()) argv->insert(argv->end(), {"--api-key-file", key_file});
  return Status::ok();
}

Status ServiceLauncher::start() {
  const std::string bin = net::executable_dir();
  // A LLaVA checkpoint (config.json with a vision_config) gets the fourth service.
  bool vision = false;
  // With the vision service on the GPU too: what the worker leaves it, whichever starts first.
  int64_t vision_reserve_bytes = 0;
  {
    std::ifstream config(std::filesystem::path(options_.model_dir) / "config.json");
    if (config) {
      const nlohmann::json j = nlohmann::json::parse(config, nullptr, false);
      vision = j.is_object() && j.contains("vision_config");
      if (vision && options_.device == "cuda") {
        if (auto llava = parse_llava_config(j); llava.is_ok()) {
          const int64_t elem_bytes = options_.dtype == "float32" ? 4 : 2;
          vision_reserve_bytes =
              llava_vision_device_bytes(*llava, elem_bytes, options_.vision_pool_bytes);
        }
      }
    }
  }
  std::vector<const char*> programs = {"litellama-scheduler", "litellama-worker",
                                       "litellama-tokenizer"};
  if (vision) programs.push_back("litellama-vision");
  for (const char* name : programs) {
    if (!std::filesystem::exists(bin + "/" + name)) {
      return make_error(StatusCode::kNotFound, "{} is not next to this executable in {}", name,
                        bin);
    }
  }
  LITELLAMA_RETURN_IF_ERROR(net::prepare_run_dir(options_.run_dir));
  std::error_code ec;
  if (!options_.log_dir.empty()) std::filesystem::create_directories(options_.log_dir, ec);
  client_endpoint_ = options_.client_endpoint.empty()
                         ? net::ipc_endpoint(options_.run_dir, "client")
                         : options_.client_endpoint;
  LITELLAMA_RETURN_IF_ERROR(net::prepare_endpoint(client_endpoint_, options_.insecure_tcp));
  auto metrics = [&](int offset) {
    return options_.metrics_port > 0
               ? (options_.metrics_host.find(':') != std::string::npos
                      ? fmt::format("[{}]:{}", options_.metrics_host,
                                    options_.metrics_port + offset)
                      : fmt::format("{}:{}", options_.metrics_host, options_.metrics_port + offset))
               : std::string();
  };
  const std::string worker_ep = net::ipc_endpoint(options_.run_dir, "worker");
  const std::string tokenizer_ep = net::ipc_endpoint(options_.run_dir, "tokenizer");
  const std::string vision_ep = net::ipc_endpoint(options_.run_dir, "vision");
  services_.clear();
  auto add = [this](std::string name, std::vector<std::string> argv, std::string metrics_listen) {
    Service& s = services_.emplace_back();
    s.name = std::move(name);
    s.argv = std::move(argv);
    s.metrics_listen = std::move(metrics_listen);
  };
  add("scheduler",
      {bin + "/litellama-scheduler", "--client-endpoint", client_endpoint_, "--worker-endpoint",
       worker_ep, "--tokenizer-endpoint", tokenizer_ep, "--metrics", metrics(0), "--log-level",
       options_.log_level, "--max-batch-tokens", std::to_string(options_.max_batch_tokens),
       "--max-batch-seqs", std::to_string(options_.max_batch_seqs), "--vision-endpoint",
       vision ? vision_ep : std::string("none"), "--max-image-bytes",
       std::to_string(options_.max_image_bytes)},
      metrics(0));
  if (options_.insecure_tcp) services_.back().argv.push_back("--insecure-tcp");
  if (options_.no_prefix_cache) services_.back().argv.push_back("--no-prefix-cache");
  if (options_.max_waiting_requests > 0) {
    services_.back().argv.insert(
        services_.back().argv.end(),
        {"--max-waiting-requests", std::to_string(options_.max_waiting_requests)});
  }
  LITELLAMA_RETURN_IF_ERROR(add_api_flags(&services_.back().argv));
  add("worker",
      {bin + "/litellama-worker",
       "--model",
       options_.model_dir,
       "--device",
       options_.device,
       "--dtype",
       options_.dtype,
       "--scheduler",
       worker_ep,
       "--metrics",
       metrics(1),
       "--log-level",
       options_.log_level,
       "--kv-slots",
       std::to_string(options_.kv_slots),
       "--threads",
       std::to_string(options_.threads),
       "--max-batch-tokens",
       std::to_string(options_.max_batch_tokens),
       "--max-batch-seqs",
       std::to_string(options_.max_batch_seqs)},
      metrics(1));
  std::vector<std::string>& worker_argv = services_.back().argv;
  if (options_.kv_cache_bytes > 0) {
    worker_argv.insert(worker_argv.end(),
                       {"--kv-cache-bytes", std::to_string(options_.kv_cache_bytes)});
  }
  if (options_.gpu_memory_utilization > 0) {
    worker_argv.insert(worker_argv.end(), {"--gpu-memory-utilization",
                                           fmt::format("{}", options_.gpu_memory_utilization)});
  }
  if (options_.max_model_len > 0) {
    worker_argv.insert(worker_argv.end(),
                       {"--max-model-len", std::to_string(options_.max_model_len)});
  }
  if (vision_reserve_bytes > 0 && options_.kv_slots == 0) {
    worker_argv.insert(worker_argv.end(),
                       {"--reserve-device-bytes", std::to_string(vision_reserve_bytes)});
  }
  for (int32_t i = 0; i < options_.n_tokenizers; ++i) {
    add(fmt::format("tokenizer-{}", i),
        {bin + "/litellama-tokenizer", "--model", options_.model_dir, "--scheduler", tokenizer_ep,
         "--metrics", metrics(2 + i), "--log-level", options_.log_level},
        metrics(2 + i));
    if (!options_.chat_template_file.empty()) {
      services_.back().argv.insert(services_.back().argv.end(),
                                   {"--chat-template", options_.chat_template_file});
    }
  }
  if (vision) {
    // The image encoder: its own metrics port after the tokenizers', on the worker's device and
    // in its dtype (a device pool is mapped by a CUDA worker, a shared-memory one read by a CPU
    // worker); a crash or kill is restarted like any service, and the worker opens the new
    // process's pool when steps name it.
    const std::string listen = metrics(2 + options_.n_tokenizers);
    add("vision",
        {bin + "/litellama-vision", "--model", options_.model_dir, "--device", options_.device,
         "--dtype", options_.dtype, "--scheduler", vision_ep, "--metrics", listen, "--log-level",
         options_.log_level, "--vision-pool-bytes", std::to_string(options_.vision_pool_bytes),
         "--max-image-bytes", std::to_string(options_.max_image_bytes)},
        listen);
  }
  // A server already on this run dir would refuse our scheduler, and our worker and tokenizers
  // would join it: refuse before starting anything. The scheduler takes the locks for good.
  for (const std::string& endpoint : {client_endpoint_, worker_ep, tokenizer_ep, vision_ep}) {
    auto lock = net::ListenerLock::acquire(endpoint);
    if (!lock) return lock.status();
  }
  // A taken port would make that service exit at once; say which and why before starting any.
  for (const Service& s : services_) {
    if (s.metrics_listen.empty()) continue;
    if (Status st = net::MetricsServer::check_available(s.metrics_listen); !st) {
      return make_error(st.code(),
                        "metrics port of the {}: {}; pass --metrics-port with {} free ports "
                        "from there (the scheduler's, the worker's, one per tokenizer, the "
                        "vision service's for LLaVA models), or --metrics-port 0 to turn "
                        "metrics off",
                        s.name, st.message(), 2 + options_.n_tokenizers + (vision ? 1 : 0));
    }
  }
  if (!api_listen().empty()) {
    if (Status st = net::MetricsServer::check_available(api_listen()); !st) {
      return make_error(st.code(),
                        "the HTTP API's address: {}; pass another --port (or --port 0 "
                        "to turn the API off)",
                        st.message());
    }
  }
  for (Service& s : services_) LITELLAMA_RETURN_IF_ERROR(launch(s));
  return Status::ok();
}

Status ServiceLauncher::wait_ready(int timeout_ms) {
  LITELLAMA_ASSIGN_OR_RETURN(auto client, net::SchedulerClient::connect(client_endpoint_));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    // Whatever made a service exit before the others were up (a bad model, a taken port) would
    // most likely make it exit again: report it instead of waiting out the timeout.
    for (Service& s : services_) {
      if (auto code = s.process.poll()) {
        return make_error(StatusCode::kUnavailable, "{}",
                          describe_exit(s, *code, " while the services were starting"));
      }
    }
    if (client->wait_ready(500).is_ok()) return Status::ok();
  }
  return make_error(StatusCode::kUnavailable, "the services were not ready after {} ms",
                    timeout_ms);
}

Status ServiceLauncher::supervise(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    for (Service& s : services_) {
      auto code = s.process.poll();
      if (!code || stop.load()) continue;
      if (!options_.restart || *code == net::kExitConfigError) {
        return make_error(StatusCode::kUnavailable, "{}", describe_exit(s, *code));
      }
      const double ran_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
      s.n_quick_exits = ran_seconds < kQuickExitSeconds ? s.n_quick_exits + 1 : 0;
      if (s.n_quick_exits >= kMaxQuickExits) {
        return make_error(StatusCode::kUnavailable,
                          "{}, the {}th time in a row within {} s of a start; giving up",
                          describe_exit(s, *code), kMaxQuickExits, kQuickExitSeconds);
      }
      ++s.n_restarts;
      std::fprintf(stderr, "litellama serve: %s exited with status %d; restarting (%d)\n",
                   s.name.c_str(), *code, s.n_restarts);
      // Back off a little when a service keeps dying.
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * (1 << s.n_quick_exits)));
      if (Status st = launch(s); !st) return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::ok();
}

void ServiceLauncher::stop_all() {
  // Peers first, so the scheduler answers its clients while it still can.
  for (size_t i = services_.size(); i-- > 1;) services_[i].process.signal(SIGTERM);
  for (size_t i = services_.size(); i-- > 1;) services_[i].process.stop(5000);
  if (!services_.empty()) services_[0].process.stop(5000);
  services_.clear();
}

}  // namespace litellama::cli
