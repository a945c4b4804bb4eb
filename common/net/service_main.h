// What the three service mains share: the flags every service has (run directory, metrics
// listener, heartbeats, log level) and the start/run/exit-status policy.
#pragma once

#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/net/child_process.h"
#include "common/net/service_notify.h"
#include "common/net/stop_signal.h"

namespace litellama::net {

// Binds the shared flags to a service's option fields. `default_metrics` is its default
// HOST:PORT; `peer_timeout_help` says whose silence the timeout is about.
template <typename Options>
void add_common_service_flags(CLI::App& app, Options& options, std::string& run_dir,
                              std::string& log_level, const std::string& default_metrics,
                              const char* peer_timeout_help) {
  app.add_option("--run-dir", run_dir, "Directory of the default ipc:// endpoints")
      ->capture_default_str();
  options.metrics_listen = default_metrics;
  app.add_option("--metrics", options.metrics_listen,
                 "HOST:PORT of /metrics, /health, /ready ('' disables)")
      ->capture_default_str();
  app.add_option("--heartbeat-ms", options.heartbeat_interval_ms, "Heartbeat interval")
      ->capture_default_str()
      ->check(CLI::Range(10, 60000));
  app.add_option("--peer-timeout-ms", options.peer_timeout_ms, peer_timeout_help)
      ->capture_default_str();
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
