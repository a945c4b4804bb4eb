// litellama-tokenizer: parses flags and runs one TokenizerService.
#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/net/child_process.h"
#include "common/net/stop_signal.h"
#include "common/net/zmq_util.h"
#include "services/tokenizer/service/tokenizer_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-tokenizer: stateless encode and incremental detokenize"};
  litellama::TokenizerOptions options;
  std::string run_dir = "/tmp/litellama";
  std::string log_level = "info";
  app.add_option("--model", options.tokenizer_dir,
                 "Model (or tokenizer) directory with tokenizer.json")
      ->required();
  app.add_option("--run-dir", run_dir, "Directory of the default ipc:// endpoints")
      ->capture_default_str();
  app.add_option("--scheduler", options.scheduler_endpoint,
                 "The scheduler's tokenizer endpoint (default ipc://RUN_DIR/tokenizer.sock)");
  options.metrics_listen = "127.0.0.1:9402";
  app.add_option("--metrics", options.metrics_listen,
                 "HOST:PORT of /metrics, /health, /ready ('' disables)")
      ->capture_default_str();
  app.add_option("--heartbeat-ms", options.heartbeat_interval_ms, "Heartbeat interval")
      ->capture_default_str()
      ->check(CLI::Range(10, 60000));
  app.add_option("--peer-timeout-ms", options.peer_timeout_ms,
                 "The scheduler silent this long is down")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  litellama::init_logging("tokenizer", log_level);
  if (options.scheduler_endpoint.empty()) {
    options.scheduler_endpoint = litellama::net::ipc_endpoint(run_dir, "tokenizer");
  }
  litellama::TokenizerService service(options);
  litellama::net::install_stop_signal(service.stop_flag());
  if (auto st = service.start(); !st) {
    // Nothing here gets better by restarting (a port or endpoint taken, files missing).
    LITELLAMA_LOG_ERROR("{}", st.to_string());
    return litellama::net::kExitConfigError;
  }
  service.run();
  return 0;
}
