// litellama-worker: parses flags and runs the WorkerService.
#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/net/child_process.h"
#include "common/net/stop_signal.h"
#include "common/net/zmq_util.h"
#include "services/worker/service/worker_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-worker: owns the device, runs prefill/decode steps, samples"};
  litellama::WorkerOptions options;
  std::string run_dir = "/tmp/litellama";
  std::string device = "cpu";
  std::string log_level = "info";
  app.add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  app.add_option("--device", device, "cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--run-dir", run_dir, "Directory of the default ipc:// endpoints")
      ->capture_default_str();
  app.add_option("--scheduler", options.scheduler_endpoint,
                 "The scheduler's worker endpoint (default ipc://RUN_DIR/worker.sock)");
  options.metrics_listen = "127.0.0.1:9401";
  app.add_option("--metrics", options.metrics_listen,
                 "HOST:PORT of /metrics, /health, /ready ('' disables)")
      ->capture_default_str();
  app.add_option("--kv-slots", options.runner.n_kv_slots, "KV pool size in tokens (0: from memory)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 28));
  app.add_option("--threads", options.runner.n_threads, "CPU threads (0: all)")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", options.runner.max_batch_tokens, "Tokens per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batch-seqs", options.runner.max_batch_seqs, "Sequences per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--step-ring", options.step_ring_name,
                 "Shared-memory name of the step ring (default litellama-step-PID-RANDOM)");
  app.add_option("--heartbeat-ms", options.heartbeat_interval_ms, "Heartbeat interval")
      ->capture_default_str()
      ->check(CLI::Range(10, 60000));
  app.add_option("--peer-timeout-ms", options.peer_timeout_ms,
                 "The scheduler silent this long is down")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  litellama::init_logging("worker", log_level);
  options.runner.device = device == "cuda" ? litellama::Device::kCuda : litellama::Device::kCpu;
  if (options.scheduler_endpoint.empty()) {
    options.scheduler_endpoint = litellama::net::ipc_endpoint(run_dir, "worker");
  }
  litellama::WorkerService service(options);
  litellama::net::install_stop_signal(service.stop_flag());
  if (auto st = service.start(); !st) {
    // Nothing here gets better by restarting (a port or endpoint taken, files missing).
    LITELLAMA_LOG_ERROR("{}", st.to_string());
    return litellama::net::kExitConfigError;
  }
  if (auto st = service.run(); !st) {
    LITELLAMA_LOG_ERROR("{}", st.to_string());
    return 1;
  }
  return 0;
}
