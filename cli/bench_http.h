// The HTTP side of `litellama bench --base-url`: the same random-token workloads sent to any
// OpenAI-compatible server as streaming /v1/completions requests (prompt as token ids,
// ignore_eos, stream_options.include_usage), many at once over libcurl's multi_socket interface
// (an epoll set of its sockets: each wake-up drives only the streams with data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/proto/client_messages.h"
#include "common/status.h"

namespace litellama::cli {

struct HttpBenchRequest {
  std::vector<int32_t> prompt_ids;
  int32_t max_tokens = 16;
  SamplingParams sampling;
};

struct HttpBenchRecord {
  double t_submit = 0.0, t_first = 0.0, t_last = 0.0;  // seconds since the run began
  int32_t n_output = 0;     // the server's usage.completion_tokens, else the chunks with text
  std::vector<double> itl;  // gaps between chunks with text
  bool ok = false;
  std::string error;
};

// The first model GET {base_url}/models lists.
Result<std::string> http_first_model(const std::string& base_url, const std::string& api_key);

// Sends requests[i] at arrivals[i] seconds (0: at once) with at most `concurrency` in flight
// (0: no limit); fills records (same size) and returns the run's duration in seconds.
Result<double> run_http_load(const std::string& base_url, const std::string& api_key,
                             const std::string& model,
                             const std::vector<HttpBenchRequest>& requests,
                             const std::vector<double>& arrivals, int32_t concurrency,
                             int32_t timeout_ms, std::vector<HttpBenchRecord>* records);

}  // namespace litellama::cli
