// ServiceLauncher: starts litellama-scheduler, litellama-worker and N litellama-tokenizer
// processes (sibling binaries of this executable) on one run directory, restarts any that dies,
// and stops them all in order (tokenizers and worker, then the scheduler).
//
// Failing fast: the metrics ports are checked before anything starts; a service that exits while
// the others are still coming up ends start-up with its exit status and the end of its log; a
// service that exits with net::kExitConfigError (its port or endpoint is taken) is not restarted
// but ends supervision; one that keeps dying right after each restart is given up on. A slow
// service (a CUDA worker loading weights) is never restarted for being slow: only exits count.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/net/child_process.h"
#include "common/net/run_dir.h"
#include "common/status.h"

namespace litellama::cli {

struct LaunchOptions {
  std::string model_dir;
  std::string device = "cpu";
  std::string dtype = "auto";  // litellama-worker --dtype
  std::string run_dir = net::default_run_dir();
  std::string client_endpoint;  // "" : ipc://RUN_DIR/client.sock
  bool insecure_tcp = false;    // allow a client endpoint off loopback (--insecure-tcp)
  int32_t n_tokenizers = 1;
  int32_t kv_slots = 0;
  int32_t threads = 0;
  int32_t max_batch_tokens = 2048;
  int32_t max_batch_seqs = 128;
  bool no_prefix_cache = false;      // scheduler: --no-prefix-cache
  int32_t max_waiting_requests = 0;  // scheduler: refuse as overloaded beyond (0: no bound)
  std::string metrics_host = "127.0.0.1";
  int32_t metrics_port = 9400;  // scheduler; worker +1, tokenizers +2.. ; 0: no metrics
  std::string log_level = "info";
  std::string log_dir;  // "" : children write to this terminal
  bool restart = true;
  // The scheduler's OpenAI-compatible HTTP API (litellama serve): off when api_port is 0.
  std::string api_host = "127.0.0.1";
  int32_t api_port = 0;
  std::string api_key;       // written to a 0600 file in the run dir, never on a command line
  std::string api_key_file;  // or read from here by the scheduler
  std::string served_model_name;
  int64_t max_model_len = 0;
  int64_t max_request_bytes = int64_t{4} << 20;
  // The scheduler's --max-image-request-bytes and --allowed-local-media-path ("" : off).
  int64_t max_image_request_bytes = int64_t{64} << 20;
  std::string allowed_local_media_path;

  std::string chat_template_file;     // litellama-tokenizer --chat-template
  int64_t kv_cache_bytes = 0;         // litellama-worker --kv-cache-bytes (0: its default)
  double gpu_memory_utilization = 0;  // litellama-worker --gpu-memory-utilization (0: its default)
  // LLaVA checkpoints: the vision service's pool and the largest image a request may carry.
  int64_t vision_pool_bytes = int64_t{256} << 20;
  int64_t max_image_bytes = int64_t{20} << 20;
};

// Registers the flags of LaunchOptions on a subcommand (serve, chat --start-services).
void add_launch_options(CLI::App* sub, LaunchOptions* options);

class ServiceLauncher {
 public:
  explicit ServiceLauncher(LaunchOptions options);
  ~ServiceLauncher();

  Status start();
  // Waits until the scheduler reports a worker and a tokenizer up; fails at once when a service
  // exits meanwhile.
  Status wait_ready(int timeout_ms);
  // Restarts dead children until *stop (then returns ok, without stopping them), or until a
  // child cannot be brought back (returns why).
  Status supervise(const std::atomic<bool>& stop);
  void stop_all();

  const std::string& client_endpoint() const { return client_endpoint_; }
  // HOST:PORT of the HTTP API, "" when off.
  std::string api_listen() const;

 private:
  struct Service {
    std::string name;
    std::vector<std::string> argv;
    std::string metrics_listen;  // "" : off
    net::ChildProcess process;
    int32_t n_restarts = 0;
    int32_t n_quick_exits = 0;  // exits in a row within kQuickExitSeconds of a start
    std::chrono::steady_clock::time_point started;
  };
  Status launch(Service& s);
  // The scheduler's --api-* and --max-model-len flags.
  Status add_api_flags(std::vector<std::string>* argv);
  // "<name> exited with status N<when>" plus the last lines of its log file, when there is one.
  std::string describe_exit(const Service& s, int code, const char* when = "") const;

  LaunchOptions options_;
  std::string client_endpoint_;
  std::vector<Service> services_;  // scheduler first
};

}  // namespace litellama::cli
