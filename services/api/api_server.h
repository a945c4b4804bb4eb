// ApiServer: the OpenAI-compatible HTTP front door, run inside the scheduler process.
//
// Threads: one libmicrohttpd polling thread serves every connection; one pump thread owns a
// SchedulerClient connected to the scheduler's client endpoint (the same request path as every
// other client: admission, limits and errors are the scheduler's). A request waiting for the
// scheduler, and an open stream with nothing new to send, is a suspended MHD connection: it holds
// no thread. The pump resumes a connection when its request has news.
//
// A client that goes away is noticed within kDisconnectPollMs while its connection is suspended
// (a peek at its socket) or at the next write; its scheduler requests are aborted then, which
// frees their KV slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "common/status.h"

struct MHD_Daemon;

namespace litellama::api {

// Body limits: every request's text (the body less its image URLs) is bounded by
// max_request_bytes; a /v1/chat/completions body may be as large as max_image_request_bytes
// (never less than max_request_bytes) when the excess is image URLs. A body over its limit gets
// 413 naming the option.
struct ApiOptions {
  std::string listen = "127.0.0.1:8000";  // HOST:PORT (port 0 picks one)
  std::string api_key;                    // "" : no authentication
  int64_t max_request_bytes = int64_t{4} << 20;
  int64_t max_image_request_bytes = int64_t{64} << 20;
  // Largest image of a request (decoded data: URL or local file); the scheduler's limit too.
  int64_t max_image_bytes = int64_t{20} << 20;
  // file:// image URLs are read from under this directory; "" : refused.
  std::string allowed_local_media_path;
  std::string served_model_name;   // "" : the worker's model name
  std::string scheduler_endpoint;  // the scheduler's client endpoint
  unsigned int connection_limit = 1024;
};

struct Job;  // one HTTP request, shared by the MHD thread and the pump (api_server.cpp)

class ApiServer {
 public:
  // `registry` is what /metrics serves (the scheduler's).
  static Result<std::unique_ptr<ApiServer>> start(ApiOptions options,
                                                  std::shared_ptr<prometheus::Registry> registry);
  ~ApiServer();

  int port() const { return port_; }

  // Internal: called from the MHD callbacks (api_server.cpp).
  struct Impl;

 private:
  ApiServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace litellama::api
