// MetricsServer: one HTTP listener per service (GNU libmicrohttpd) serving the service's
// prometheus-cpp registry at /metrics, liveness at /health (200 while the process runs) and
// readiness at /ready (200, or 503 with the reason while loading or while a peer is down).
// Every registry it serves also carries litellama_build_info{version}.
//
// Not civetweb (which prometheus-cpp's own exposer uses): civetweb starts its threads with a
// fixed small stack, and a process that links cuBLAS (the CUDA worker) carries ~100 KB of static
// thread-local storage that does not fit in it, so civetweb cannot create a thread there.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "common/status.h"

struct MHD_Daemon;

namespace litellama::net {

class MetricsServer {
 public:
  // Returns "" when ready, else why not. Called from the HTTP threads: must be thread-safe.
  using ReadyCheck = std::function<std::string()>;

  // `listen` is "PORT" (loopback only) or "HOST:PORT" ("*:PORT" or "0.0.0.0:PORT" for every
  // interface; port 0 picks a free one). A port another process holds
  // fails with kResourceExhausted and a message that says so.
  static Result<std::unique_ptr<MetricsServer>> start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry, ReadyCheck ready);
  ~MetricsServer();

  // Whether `listen` could be bound now (a socket with SO_REUSEADDR bound and
  // closed again). kResourceExhausted when the port is in use, kInvalidArgument when the address
  // is malformed or not local. A launcher calls this before starting services so that a taken
  // port is reported once, up front, instead of as a service that keeps exiting.
  static Status check_available(const std::string& listen);

  int port() const { return port_; }

  // Adds litellama_build_info{version="..."} 1 to `registry` (start() does it for its registry).
  static void add_build_info(prometheus::Registry& registry);

  // What the HTTP thread reads; owned by the server, alive until the daemon has stopped.
  struct Handlers {
    std::shared_ptr<prometheus::Registry> registry;
    ReadyCheck ready;
  };

 private:
  MetricsServer() = default;

  std::unique_ptr<Handlers> handlers_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace litellama::net
