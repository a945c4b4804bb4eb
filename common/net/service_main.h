// What the three service mains share: the flags every service has (run directory, metrics
// listener, heartbeats, log level) and the start/run/exit-status policy.
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

#include "common/cli_option.h"
#include "common/log.h"
#include "common/net/child_process.h"
#include "common/net/run_dir.h"
#include "common/net/service_notify.h"
#include "common/net/stop_signal.h"

namespace litellama::net {

// Binds the shared flags to a service's option fields. `default_metrics` is its default
// HOST:PORT; `peer_timeout_help` says whose silence the timeout is about.
template <typename Options>
void add_common_service_flags(CLI::App& app, Options& options, std::string& run_dir,
                              std::string& log_level, const std::string& default_metrics,
                              const char* peer_timeout_help) {
  run_dir = default_run_dir();
  app.add_option("--run-dir", run_dir,
                 "Directory of the default ipc:// endpoints (created 0750; refused when another "
                 "user owns it or others can write it)")
      ->capture_default_str();
  options.metrics_listen = default_metrics;
  app.add_option("--metrics", options.metrics_listen,
                 "PORT or HOST:PORT of /metrics, /health, /ready (a bare PORT is loopback only; "
                 "'' disables)")
      ->capture_default_str();
  // Applied after parsing: --metrics-host replaces the host of --metrics.
  auto metrics_host = std::make_shared<std::string>();
  app.add_option("--metrics-host", *metrics_host,
                 "Host the metrics listener binds (default loopback; 0.0.0.0 or :: for all "
                 "interfaces)");
  app.parse_complete_callback([&options, metrics_host] {
    if (metrics_host->empty() || options.metrics_listen.empty()) return;
    const size_t colon = options.metrics_listen.rfind(':');
    const std::string port = colon == std::string::npos ? options.metrics_listen
                                                        : options.metrics_listen.substr(colon + 1);
    const bool v6 = metrics_host->find(':') != std::string::npos;
    options.metrics_listen = (v6 ? "[" + *metrics_host + "]" : *metrics_host) + ":" + port;
  });
  app.add_flag("--insecure-tcp", options.allow_insecure_tcp,
               "Allow tcp:// endpoints on addresses other than loopback (ZeroMQ tcp is not "
               "authenticated: only on a network you trust)");
  add_bounded_option(app, "--heartbeat-ms", options.heartbeat_interval_ms, "Heartbeat interval", 10,
                     60000);
  add_bounded_option(app, "--peer-timeout-ms", options.peer_timeout_ms,
                     std::string(peer_timeout_help) + " (at least twice --heartbeat-ms)", 1,
                     3600000);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
}

// Starts the service and runs it until SIGINT/SIGTERM. Exit status: kExitConfigError when it
// cannot start (nothing gets better by restarting: a port or endpoint taken, files missing), 1
// when running fails, 0 after a clean stop.
//
// Service manager: READY=1 as soon as start() has returned (its sockets are bound and what it
// loads synchronously is loaded), unless the service declares kNotifiesReadyItself and sends it
// when its background loading is done (the worker); STOPPING=1 when the stop signal arrives.
template <typename Service>
int run_service(Service& service) {
  install_stop_signal(service.stop_flag());
  // The flag is the service's, which the caller destroys after this returns.
  struct Detach {
    ~Detach() { detach_stop_signal(); }
  } detach;
  if (auto st = service.start(); !st) {
    LITELLAMA_LOG_ERROR("{}", st.to_string());
    notify_status(st.to_string());
    return kExitConfigError;
  }
  if constexpr (!requires { Service::kNotifiesReadyItself; }) notify_ready("serving");
  const StoppingNotifier stopping(service.stop_flag());
  if constexpr (std::is_void_v<decltype(service.run())>) {
    service.run();
  } else {
    if (auto st = service.run(); !st) {
      LITELLAMA_LOG_ERROR("{}", st.to_string());
      return 1;
    }
  }
  return 0;
}

}  // namespace litellama::net
