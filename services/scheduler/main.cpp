// litellama-scheduler: parses flags and runs the SchedulerService.
#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/net/service_main.h"
#include "common/net/zmq_util.h"
#include "services/scheduler/scheduler_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-scheduler: request lifecycle, continuous batching, streaming"};
  std::string run_dir;  // add_common_service_flags sets the default
  litellama::SchedulerOptions options;
  std::string log_level = "info";
  app.add_option("--client-endpoint", options.client_endpoint,
                 "Client API endpoint (default ipc://RUN_DIR/client.sock; tcp://HOST:PORT works)");
  app.add_option("--worker-endpoint", options.worker_endpoint,
                 "Worker endpoint (default ipc://RUN_DIR/worker.sock)");
  app.add_option("--tokenizer-endpoint", options.tokenizer_endpoint,
                 "Tokenizer endpoint (default ipc://RUN_DIR/tokenizer.sock)");
  app.add_option("--peer-wait-ms", options.peer_wait_ms,
                 "How long a request waits for a missing worker or tokenizer")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  app.add_option("--max-batch-tokens", options.batcher.max_batch_tokens, "Tokens per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batch-seqs", options.batcher.max_batch_seqs, "Sequences per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-prefill-chunk", options.batcher.max_prefill_chunk,
                 "Prompt tokens of one request per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-prompt-bytes", options.max_prompt_bytes,
                 "Largest text prompt (prompt + chat messages) in bytes; larger is refused")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{15} << 20));
  app.add_option("--encode-timeout-ms", options.encode_timeout_ms,
                 "A prompt not tokenized in this long fails its request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  app.add_option("--max-tokenizer-retries", options.max_tokenizer_retries,
                 "Times a request's work is re-sent after the tokenizer holding it died")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  bool no_prefix_cache = false;
  app.add_flag("--no-prefix-cache", no_prefix_cache,
               "Turn the prefix cache off (every request computes its whole prompt)");
  app.add_option("--max-waiting-requests", options.max_waiting_requests,
                 "Waiting requests beyond which new ones are refused as overloaded (0: no bound)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  litellama::net::add_common_service_flags(app, options, run_dir, log_level, "127.0.0.1:9400",
                                           "A peer silent this long is down");
  CLI11_PARSE(app, argc, argv);

  options.batcher.prefix_cache = !no_prefix_cache;
  litellama::init_logging("scheduler", log_level);
  if (options.client_endpoint.empty()) {
    options.client_endpoint = litellama::net::ipc_endpoint(run_dir, "client");
  }
  if (options.worker_endpoint.empty()) {
    options.worker_endpoint = litellama::net::ipc_endpoint(run_dir, "worker");
  }
  if (options.tokenizer_endpoint.empty()) {
    options.tokenizer_endpoint = litellama::net::ipc_endpoint(run_dir, "tokenizer");
  }
  litellama::SchedulerService service(options);
  return litellama::net::run_service(service);
}
