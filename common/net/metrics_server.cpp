#include "common/net/metrics_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include <microhttpd.h>
#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#ifndef LITELLAMA_VERSION
#error "LITELLAMA_VERSION is set by common/net/CMakeLists.txt"
#endif

namespace litellama::net {

namespace {

// One request: GET /metrics, /health or /ready. Everything else is 404 (405 for other methods).
MHD_Result answer(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* /*upload_data*/,
                  size_t* /*upload_data_size*/, void** /*con_cls*/) {
  const auto* handlers = static_cast<const MetricsServer::Handlers*>(cls);
  unsigned int code = MHD_HTTP_OK;
  std::string body;
  const char* content_type = "text/plain";
  const std::string path = url ? url : "";
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = "only GET\n";
  } else if (path == "/metrics") {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, handlers->registry->Collect());
    body = out.str();
    content_type = "text/plain; version=0.0.4";
  } else if (path == "/health") {
    body = "ok\n";
  } else if (path == "/ready") {
    const std::string why = handlers->ready ? handlers->ready() : std::string();
    if (why.empty()) {
      body = "ready\n";
    } else {
      code = MHD_HTTP_SERVICE_UNAVAILABLE;
      body = why + "\n";
    }
  } else {
    code = MHD_HTTP_NOT_FOUND;
    body = "not found\n";
  }
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  const MHD_Result queued = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return queued;
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
  if (port->empty() || port->size() > 5 ||
      port->find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  return std::stol(*port) <= 65535;
}

// The passive (listening) addresses of PORT or HOST:PORT; the caller frees *found.
Status resolve_listen(const std::string& listen, addrinfo** found) {
  std::string host, port;
  if (!split_listen(listen, &host, &port)) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not PORT or HOST:PORT with a port from 0 to 65535", listen);
  }
  // A bare port is loopback only: metrics and readiness say what the service is doing, and no
  // listener of ours is reachable from elsewhere unless a host is named ("*" or 0.0.0.0: all).
  if (host.empty()) host = "127.0.0.1";
  if (host == "*") host.clear();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  *found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, found);
  if (rc != 0 || *found == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "cannot resolve '{}': {}", listen,
                      rc != 0 ? gai_strerror(rc) : "no address");
  }
  return Status::ok();
}

}  // namespace

Status MetricsServer::check_available(const std::string& listen) {
  addrinfo* found = nullptr;
  LITELLAMA_RETURN_IF_ERROR(resolve_listen(listen, &found));
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

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry, ReadyCheck ready) {
  addrinfo* found = nullptr;
  LITELLAMA_RETURN_IF_ERROR(resolve_listen(listen, &found));
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  add_build_info(*registry);
  server->handlers_ = std::make_unique<Handlers>();
  server->handlers_->registry = std::move(registry);
  server->handlers_->ready = std::move(ready);
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
  if (found->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  server->daemon_ =
      MHD_start_daemon(flags, 0, nullptr, nullptr, &answer, server->handlers_.get(),
                       MHD_OPTION_SOCK_ADDR, found->ai_addr, MHD_OPTION_CONNECTION_LIMIT, 64u,
                       MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  const int start_errno = errno;
  freeaddrinfo(found);
  if (server->daemon_ == nullptr) {
    // Say which of the usual causes it is.
    Status why = check_available(listen);
    if (!why)
      return make_error(why.code(), "cannot serve metrics on '{}': {}", listen, why.message());
    return make_error(StatusCode::kUnavailable, "cannot serve metrics on '{}': {}", listen,
                      std::strerror(start_errno));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info ? info->port : 0;
  return server;
}

void MetricsServer::add_build_info(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("litellama_build_info")
      .Help("1, labelled with the version of the running build")
      .Register(registry)
      .Add({{"version", LITELLAMA_VERSION}})
      .Set(1);
}

MetricsServer::~MetricsServer() {
  if (daemon_) MHD_stop_daemon(daemon_);
}

}  // namespace litellama::net
