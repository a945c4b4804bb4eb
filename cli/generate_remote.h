// The served path of `litellama generate`: the same request and JSON output as the offline
// engine, sent to a running scheduler (`--server ADDR`), with text streamed as it comes when not
// --json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/proto/sampling_params.h"
#include "common/status.h"

namespace litellama::cli {

// Default client endpoint of `litellama serve`: ipc://DEFAULT_RUN_DIR/client.sock (run_dir.h).
std::string default_server();
// How long a client waits for the connection to its server before it fails.
inline constexpr int kConnectTimeoutMs = 2000;

// "ipc://...", "tcp://..." pass through; "HOST:PORT" becomes tcp://HOST:PORT; a directory
// becomes ipc://DIR/client.sock. A tcp address whose port is not a number in 1..65535 is refused
// (ZeroMQ would accept it and never connect).
Result<std::string> server_endpoint(const std::string& address);

struct RemoteGenerateArgs {
  std::string server;
  std::string input_ids;  // comma-separated; exactly one of input_ids and prompt
  std::string prompt;
  bool chat = false;  // send --prompt as a user turn through the chat template
  int32_t max_new_tokens = 16;
  SamplingParams sampling;
  std::string stop_token_ids;  // comma-separated
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int32_t top_logits = 0;  // largest raw logits of the first generated position
  int32_t priority = 0;    // scheduling priority (larger first)
  // Image files (JPEG/PNG) of a LLaVA prompt, in the order of its image tokens.
  std::vector<std::string> images;
  bool json = false;
  int32_t timeout_ms = 120000;  // no answer for this long: fail
};

// Runs one request against the scheduler; returns the process exit code.
int run_generate_remote(const RemoteGenerateArgs& args);

}  // namespace litellama::cli
