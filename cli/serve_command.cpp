// litellama serve: starts the scheduler, the worker and the tokenizers, supervises them, and
// stops them cleanly on Ctrl-C or SIGTERM.
#include <atomic>
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/service_launcher.h"
#include "common/cli_option.h"
#include "common/net/stop_signal.h"

namespace litellama::cli {

namespace {

std::atomic<bool> g_stop{false};

int run_serve(LaunchOptions options, int ready_timeout_ms) {
  const char* cmd = "serve";
  if (options.model_dir.empty()) {
    auto dir = default_model_dir();
    if (!dir.is_ok()) return fail(cmd, dir.status());
    options.model_dir = *dir;
  }
  net::install_stop_signal(&g_stop);
  ServiceLauncher launcher(options);
  if (Status st = launcher.start(); !st) return fail(cmd, st);
  std::fprintf(stderr, "litellama serve: starting %s on %s ...\n", options.model_dir.c_str(),
               options.device.c_str());
  if (Status st = launcher.wait_ready(ready_timeout_ms); !st) {
    launcher.stop_all();
    return fail(cmd, st);
  }
  std::fprintf(stderr, "litellama serve: ready on %s (Ctrl-C stops)\n",
               launcher.client_endpoint().c_str());
  if (!launcher.api_listen().empty()) {
    std::fprintf(stderr, "litellama serve: OpenAI-compatible API on http://%s/v1\n",
                 launcher.api_listen().c_str());
  }
  if (options.metrics_port > 0) {
    std::fprintf(stderr,
                 "litellama serve: metrics on http://%s:%d/metrics (worker +1, "
                 "tokenizers +2..)\n",
                 options.metrics_host.c_str(), options.metrics_port);
  }
  const Status supervised = launcher.supervise(g_stop);
  std::fprintf(stderr, "litellama serve: stopping\n");
  launcher.stop_all();
  if (!supervised) return fail(cmd, supervised);
  return 0;
}

}  // namespace

void add_launch_options(CLI::App* sub, LaunchOptions* o) {
  sub->add_option("--model", o->model_dir, "model directory (default: the embedded model)");
  sub->add_option("--device", o->device, "cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--dtype", o->dtype,
                  "compute dtype: auto (cpu: float32; cuda: bfloat16, or float16 for float16 "
                  "checkpoints), float32, bfloat16 or float16")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
  sub->add_option("--run-dir", o->run_dir,
                  "directory of the ipc:// sockets (created 0750; refused when another user owns "
                  "it or others can write it)")
      ->capture_default_str();
  sub->add_option("--listen", o->client_endpoint,
                  "client endpoint (default ipc://RUN_DIR/client.sock; tcp://127.0.0.1:5555 for "
                  "tcp on loopback)");
  sub->add_flag("--insecure-tcp", o->insecure_tcp,
                "allow a --listen tcp:// address off loopback: tcp is not authenticated, anyone "
                "who reaches the port can send requests (only on a network you trust)");
  add_bounded_option(*sub, "--tokenizers", o->n_tokenizers, "tokenizer processes", 1, 64);
  sub->add_option("--kv-slots", o->kv_slots, "KV pool size in tokens (0: the worker's default)")
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "cpu: worker threads (0: all)")->capture_default_str();
  sub->add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  sub->add_option("--max-batch-seqs", o->max_batch_seqs, "sequences per step")
      ->capture_default_str();
  sub->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "scheduler: no prefix cache (every request computes its whole prompt)");
  add_bounded_option(
      *sub, "--max-waiting-requests", o->max_waiting_requests,
      "scheduler: refuse new requests as overloaded while this many wait (0: no bound)", 0,
      1 << 24);
  sub->add_option("--metrics-port", o->metrics_port,
                  "scheduler metrics port; worker +1, tokenizers +2.. (0: off)")
      ->capture_default_str()
      ->check(port_number(65535 - 2 - 64));
  sub->add_option("--metrics-host", o->metrics_host,
                  "host the metrics listeners bind (0.0.0.0 for all interfaces)")
      ->capture_default_str();
  sub->add_option("--log-dir", o->log_dir, "write each service's log here (default: stderr)");
  sub->add_option("--log-level", o->log_level, "services' log level")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  sub->add_flag_callback(
      "-v,--verbose", [o] { o->log_level = "debug"; }, "same as --log-level debug");
}

// The flags of the HTTP API, on serve only (chat --start-services has no API port).
static void add_api_options(CLI::App* sub, LaunchOptions* o) {
  o->api_port = 8000;
  // Named MODEL_DIR, not "model": CLI11 2.4 and later refuse a positional whose name equals an
  // option's long name (--model), and the installed CLI11 may be newer than Debian 12's.
  sub->add_option("MODEL_DIR", o->model_dir, "model directory (same as --model)");
  sub->add_option("--host", o->api_host, "address the HTTP API binds (0.0.0.0 for all)")
      ->capture_default_str();
  add_bounded_option(*sub, "--port", o->api_port, "port of the HTTP API (0: off)", 0, 65535);
  auto* key = sub->add_option("--api-key", o->api_key,
                              "clients must send 'Authorization: Bearer KEY' (not /health)");
  sub->add_option("--api-key-file", o->api_key_file, "read the API key from this file's first line")
      ->check(CLI::ExistingFile)
      ->excludes(key);
  sub->add_option("--served-model-name", o->served_model_name,
                  "model name /v1/models lists and requests must name (default: the model's)");
  add_bounded_option(*sub, "--max-model-len", o->max_model_len,
                     "refuse requests whose prompt + completion exceed this many tokens (0: the "
                     "model's context)",
                     int64_t{0}, int64_t{1} << 30);
  sub->add_option("--kv-cache-bytes", o->kv_cache_bytes,
                  "cpu: the most memory the KV pool takes (default 1 GiB; --kv-slots wins)")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{1} << 40));
  sub->add_option(
         "--gpu-memory-utilization", o->gpu_memory_utilization,
         "cuda: share of the device's total memory for this server's weights, KV and workspaces, "
         "whatever other processes hold, as vLLM's (default: 85% of what is free after loading; "
         "--kv-slots wins)")
      ->check(CLI::Range(0.01, 1.0));
  sub->add_option("--chat-template", o->chat_template_file,
                  "Jinja chat template file used instead of the model's own")
      ->check(CLI::ExistingFile);
  add_bounded_option(*sub, "--max-request-bytes", o->max_request_bytes,
                     "largest HTTP request body, or text of one with images (larger gets 413)",
                     int64_t{1}, int64_t{1} << 30);
  add_bounded_option(*sub, "--max-image-request-bytes", o->max_image_request_bytes,
                     "largest chat completion body with images, whose excess over "
                     "--max-request-bytes is image URLs (larger gets 413)",
                     int64_t{1}, int64_t{1} << 32);
  sub->add_option("--allowed-local-media-path", o->allowed_local_media_path,
                  "directory whose files chat image_url parts may name as file:// URLs (off by "
                  "default; no network URL is ever fetched)")
      ->check(CLI::ExistingDirectory);
  add_bounded_option(*sub, "--vision-pool-bytes", o->vision_pool_bytes,
                     "LLaVA models: size of the vision service's image embedding pool", int64_t{1},
                     int64_t{1} << 40);
  add_bounded_option(*sub, "--max-image-bytes", o->max_image_bytes,
                     "LLaVA models: largest image a request may carry", int64_t{1},
                     int64_t{1} << 30);
}

CommandMain register_serve_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto ready_timeout_ms = std::make_shared<int>(300000);
  CLI::App* sub = app.add_subcommand("serve", "start the scheduler, worker and tokenizers");
  add_launch_options(sub, options.get());
  add_api_options(sub, options.get());
  sub->add_option("--ready-timeout-ms", *ready_timeout_ms, "give up when not ready by then")
      ->capture_default_str();
  return [options, ready_timeout_ms] { return run_serve(*options, *ready_timeout_ms); };
}

}  // namespace litellama::cli
