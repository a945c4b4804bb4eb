// litellama-scheduler: parses flags and runs the SchedulerService.
#include <fstream>
#include <iterator>

#include <CLI/CLI.hpp>

#include "common/cli_option.h"
#include "common/log.h"
#include "common/net/service_main.h"
#include "common/net/zmq_util.h"
#include "services/api/api_server.h"
#include "services/scheduler/scheduler_service.h"

namespace {

// The scheduler with the HTTP API started once its sockets are bound.
class SchedulerWithApi {
 public:
  SchedulerWithApi(litellama::SchedulerOptions options, litellama::api::ApiOptions api, bool api_on)
      : service_(std::move(options)), api_options_(std::move(api)), api_on_(api_on) {}
  litellama::Status start() {
    LITELLAMA_RETURN_IF_ERROR(service_.start());
    if (!api_on_) return litellama::Status::ok();
    LITELLAMA_ASSIGN_OR_RETURN(api_,
                               litellama::api::ApiServer::start(api_options_, service_.registry()));
    LITELLAMA_LOG_INFO("HTTP API on http://{} (port {})", api_options_.listen, api_->port());
    return litellama::Status::ok();
  }
  void run() {
    service_.run();
    api_.reset();
  }
  std::atomic<bool>* stop_flag() { return service_.stop_flag(); }

 private:
  litellama::SchedulerService service_;
  litellama::api::ApiOptions api_options_;
  bool api_on_;
  std::unique_ptr<litellama::api::ApiServer> api_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"litellama-scheduler: request lifecycle, continuous batching, streaming"};
  std::string run_dir;  // add_common_service_flags sets the default
  litellama::SchedulerOptions options;
  std::string log_level = "info";
  app.add_option("--client-endpoint", options.client_endpoint,
                 "Client API endpoint (default ipc://RUN_DIR/client.sock; tcp://HOST:PORT works)");
  app.add_option("--worker-endpoint", options.worker_endpoint,
                 "Worker endpoint (default ipc://RUN_DIR/worker.sock)");
  app.add_option("--vision-endpoint", options.vision_endpoint,
                 "Vision service endpoint (default ipc://RUN_DIR/vision.sock; 'none' turns "
                 "images off)");
  litellama::add_bounded_option(app, "--max-image-bytes", options.max_image_bytes,
                                "Largest image a request may carry, in bytes", int64_t{1},
                                int64_t{1} << 30);
  app.add_option("--tokenizer-endpoint", options.tokenizer_endpoint,
                 "Tokenizer endpoint (default ipc://RUN_DIR/tokenizer.sock)");
  litellama::add_bounded_option(app, "--peer-wait-ms", options.peer_wait_ms,
                                "How long a request waits for a missing worker or tokenizer", 0,
                                3600000);
  litellama::add_bounded_option(app, "--max-batch-tokens", options.batcher.max_batch_tokens,
                                "Tokens per step", 1, 1 << 20);
  litellama::add_bounded_option(app, "--max-batch-seqs", options.batcher.max_batch_seqs,
                                "Sequences per step", 1, 1 << 16);
  litellama::add_bounded_option(app, "--max-prefill-chunk", options.batcher.max_prefill_chunk,
                                "Prompt tokens of one request per step", 1, 1 << 20);
  litellama::add_bounded_option(
      app, "--max-prompt-bytes", options.max_prompt_bytes,
      "Largest text prompt (prompt + chat messages) in bytes; larger is refused", int64_t{1},
      int64_t{15} << 20);
  litellama::add_bounded_option(app, "--encode-timeout-ms", options.encode_timeout_ms,
                                "A prompt not tokenized in this long fails its request", 1,
                                3600000);
  litellama::add_bounded_option(
      app, "--max-tokenizer-retries", options.max_tokenizer_retries,
      "Times a request's work is re-sent after the tokenizer holding it died", 0, 100);
  bool no_prefix_cache = false;
  app.add_flag("--no-prefix-cache", no_prefix_cache,
               "Turn the prefix cache off (every request computes its whole prompt)");
  litellama::add_bounded_option(
      app, "--max-waiting-requests", options.max_waiting_requests,
      "Waiting requests beyond which new ones are refused as overloaded (0: no bound)", 0, 1 << 24);
  litellama::add_bounded_option(app, "--max-model-len", options.max_model_len,
                                "Longest prompt + completion in tokens (0: the model's context)",
                                int64_t{0}, int64_t{1} << 30);
  litellama::api::ApiOptions api;
  std::string api_listen;
  std::string api_key_file;
  app.add_option("--api-listen", api_listen,
                 "HOST:PORT of the OpenAI-compatible HTTP API ('' : off; port 0 picks one)");
  app.add_option("--api-key-file", api_key_file,
                 "File whose first line is the API key clients must send as 'Authorization: "
                 "Bearer KEY'");
  app.add_option("--served-model-name", api.served_model_name,
                 "Model name the API lists and requests must name (default: the worker's)");
  litellama::add_bounded_option(app, "--max-request-bytes", api.max_request_bytes,
                                "Largest HTTP request body, or text of one with images (the body "
                                "less its image URLs); larger gets 413",
                                int64_t{1}, int64_t{1} << 30);
  litellama::add_bounded_option(
      app, "--max-image-request-bytes", api.max_image_request_bytes,
      "Largest /v1/chat/completions body whose excess over --max-request-bytes is image URLs "
      "(base64 takes 4/3 of an image's bytes); larger gets 413",
      int64_t{1}, int64_t{1} << 32);
  app.add_option("--allowed-local-media-path", api.allowed_local_media_path,
                 "Directory whose files chat image_url parts may name as file:// URLs (off by "
                 "default: such URLs get 400; the server fetches no network URL)")
      ->check(CLI::ExistingDirectory);
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
  if (options.vision_endpoint == "none") {
    options.vision_endpoint.clear();
  } else if (options.vision_endpoint.empty()) {
    options.vision_endpoint = litellama::net::ipc_endpoint(run_dir, "vision");
  }
  if (options.tokenizer_endpoint.empty()) {
    options.tokenizer_endpoint = litellama::net::ipc_endpoint(run_dir, "tokenizer");
  }
  if (!api_key_file.empty()) {
    std::ifstream in(api_key_file);
    if (!in || !std::getline(in, api.api_key) || api.api_key.empty()) {
      LITELLAMA_LOG_ERROR("--api-key-file {}: cannot read a key from its first line", api_key_file);
      return litellama::net::kExitConfigError;
    }
    while (!api.api_key.empty() && (api.api_key.back() == '\r' || api.api_key.back() == ' ')) {
      api.api_key.pop_back();
    }
  }
  api.listen = api_listen;
  api.max_image_bytes = options.max_image_bytes;
  api.scheduler_endpoint = options.client_endpoint;
  SchedulerWithApi service(options, api, !api_listen.empty());
  return litellama::net::run_service(service);
}
