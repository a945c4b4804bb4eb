#include "common/net/metrics_server.h"

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

}  // namespace

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
  try {
    server->server_ = std::make_unique<CivetServer>(options);
  } catch (const std::exception& e) {
    return make_error(StatusCode::kUnavailable, "cannot serve metrics on '{}': {}", listen,
                      e.what());
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
