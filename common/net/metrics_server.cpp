#include "common/net/metrics_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include <CivetServer.h>
#include <prometheus/text_serializer.h>

namespace litellama::net {

namespace {

void reply(mg_connection* conn, int code, const char* reason, const std::string& content_type,
           const std::string& body) {
  mg_printf(
      conn,
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
      code, reason, content_type.c_str(), body.size());
  mg_write(conn, body.data(), body.size());
}

class MetricsHandler : public CivetHandler {
 public:
  explicit MetricsHandler(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, registry_->Collect());
    reply(conn, 200, "OK", "text/plain; version=0.0.4", out.str());
    return true;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

class HealthHandler : public CivetHandler {
 public:
  bool handleGet(CivetServer*, mg_connection* conn) override {
    reply(conn, 200, "OK", "text/plain", "ok\n");
    return true;
  }
};

class ReadyHandler : public CivetHandler {
 public:
  explicit ReadyHandler(MetricsServer::ReadyCheck ready) : ready_(std::move(ready)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const std::string why = ready_ ? ready_() : std::string();
    if (why.empty()) {
      reply(conn, 200, "OK", "text/plain", "ready\n");
    } else {
      reply(conn, 503, "Service Unavailable", "text/plain", why + "\n");
    }
    return true;
  }

 private:
  MetricsServer::ReadyCheck ready_;
};

// civetweb reports why mg_start failed only through the log_message callback, on the thread that
// calls it; the constructor itself throws a generic "possible problem binding to port".
thread_local std::string t_civetweb_error;

int capture_civetweb_log(const mg_connection*, const char* message) {
  if (message != nullptr && t_civetweb_error.empty()) t_civetweb_error = message;
  return 1;  // handled: civetweb prints nothing itself
}

// Splits "PORT" or "HOST:PORT" ("[v6]:PORT" too).
bool split_listen(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    *host = "";
    *port = listen;
  } else {
    *host = listen.substr(0, colon);
    *port = listen.substr(colon + 1);
    if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
      *host = host->substr(1, host->size() - 2);
    }
  }
  if (port->empty() || port->find_first_not_of("0123456789") != std::string::npos) return false;
  return std::stol(*port) <= 65535;
}

}  // namespace

Status MetricsServer::check_available(const std::string& listen) {
  std::string host, port;
  if (!split_listen(listen, &host, &port)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not PORT or HOST:PORT", listen);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return make_error(StatusCode::kInvalidArgument, "cannot resolve '{}': {}", listen,
                      gai_strerror(rc));
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) error = errno;
    close(fd);
    if (bound) {
      error = 0;
      break;
    }
  }
  freeaddrinfo(found);
  if (error == EADDRINUSE) {
    return make_error(StatusCode::kResourceExhausted,
                      "{} is already in use by another process (a service left running, or a "
                      "second server on the same ports?)",
                      listen);
  }
  if (error == EADDRNOTAVAIL) {
    return make_error(StatusCode::kInvalidArgument, "{} is not an address of this machine", listen);
  }
  if (error != 0) {
    return make_error(StatusCode::kUnavailable, "cannot listen on {}: {}", listen,
                      std::strerror(error));
  }
  return Status::ok();
}

struct MetricsServer::Handlers {
  std::unique_ptr<MetricsHandler> metrics;
  HealthHandler health;
  std::unique_ptr<ReadyHandler> ready;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry, ReadyCheck ready) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->handlers_ = std::make_unique<Handlers>();
  server->handlers_->metrics = std::make_unique<MetricsHandler>(std::move(registry));
  server->handlers_->ready = std::make_unique<ReadyHandler>(std::move(ready));
  const std::vector<std::string> options = {"listening_ports", listen, "num_threads", "2"};
  CivetCallbacks callbacks;
  callbacks.log_message = capture_civetweb_log;
  t_civetweb_error.clear();
  try {
    server->server_ = std::make_unique<CivetServer>(options, &callbacks);
  } catch (const std::exception& e) {
    // Say which of the usual causes it is; civetweb's own text comes last.
    Status why = check_available(listen);
    std::string detail = t_civetweb_error.empty() ? e.what() : t_civetweb_error;
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == '\r')) detail.pop_back();
    if (!why) {
      return make_error(why.code(), "cannot serve metrics on '{}': {} ({})", listen, why.message(),
                        detail);
    }
    return make_error(StatusCode::kUnavailable, "cannot serve metrics on '{}': {}", listen, detail);
  }
  server->server_->addHandler("/metrics", server->handlers_->metrics.get());
  server->server_->addHandler("/health", &server->handlers_->health);
  server->server_->addHandler("/ready", server->handlers_->ready.get());
  const std::vector<int> ports = server->server_->getListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  return server;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->close();
}

}  // namespace litellama::net
