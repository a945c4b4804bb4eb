// litellama serve: starts the scheduler, the worker and the tokenizers, supervises them, and
// stops them cleanly on Ctrl-C or SIGTERM.
#include <atomic>
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/service_launcher.h"
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
  sub->add_option("--tokenizers", o->n_tokenizers, "tokenizer processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--kv-slots", o->kv_slots, "KV pool size in tokens (0: the worker's default)")
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "cpu: worker threads (0: all)")->capture_default_str();
  sub->add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  sub->add_option("--max-batch-seqs", o->max_batch_seqs, "sequences per step")
      ->capture_default_str();
  sub->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "scheduler: no prefix cache (every request computes its whole prompt)");
  sub->add_option("--max-waiting-requests", o->max_waiting_requests,
                  "scheduler: refuse new requests as overloaded while this many wait (0: no bound)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--metrics-port", o->metrics_port,
                  "scheduler metrics port; worker +1, tokenizers +2.. (0: off)")
      ->capture_default_str()
      ->check(port_number(65535 - 2 - 64));
  sub->add_option("--metrics-host", o->metrics_host,
                  "host the metrics listeners bind (0.0.0.0 for all interfaces)")
      ->capture_default_str();
  sub->add_option("--log-dir", o->log_dir, "write each service's log here (default: stderr)");
  sub->add_option("--log-level", o->log_level, "services' log level")->capture_default_str();
}

CommandMain register_serve_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto ready_timeout_ms = std::make_shared<int>(300000);
  CLI::App* sub = app.add_subcommand("serve", "start the scheduler, worker and tokenizers");
  add_launch_options(sub, options.get());
  sub->add_option("--ready-timeout-ms", *ready_timeout_ms, "give up when not ready by then")
      ->capture_default_str();
  return [options, ready_timeout_ms] { return run_serve(*options, *ready_timeout_ms); };
}

}  // namespace litellama::cli
