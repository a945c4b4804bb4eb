#include "cli/generate_remote.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "common/net/run_dir.h"
#include "common/net/scheduler_client.h"
#include "common/net/zmq_util.h"

namespace litellama::cli {

std::string default_server() {
  return net::ipc_endpoint(net::default_run_dir(), "client");
}

Result<std::string> server_endpoint(const std::string& address) {
  if (address.empty()) return default_server();
  std::error_code ec;
  std::string endpoint = address;
  if (address.find("://") == std::string::npos) {
    endpoint = std::filesystem::is_directory(address, ec) ? "ipc://" + address + "/client.sock"
                                                          : "tcp://" + address;
  }
  if (endpoint.rfind("tcp://", 0) == 0) {
    const size_t colon = endpoint.rfind(':');
    const std::string port = colon > 5 ? endpoint.substr(colon + 1) : "";
    const bool digits = !port.empty() && port.size() <= 5 &&
                        port.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return make_error(StatusCode::kInvalidArgument,
                        "--server '{}': the port must be a number from 1 to 65535 (HOST:PORT, "
                        "tcp://HOST:PORT, ipc://PATH or a run directory)",
                        address);
    }
  }
  return endpoint;
}

int run_generate_remote(const RemoteGenerateArgs& a) {
  const char* cmd = "generate";
  if (a.input_ids.empty() == a.prompt.empty()) {
    return fail(
        cmd, Status(StatusCode::kInvalidArgument, "give exactly one of --input-ids and --prompt"));
  }
  proto::GenerateRequest req;
  if (!a.input_ids.empty()) {
    auto ids = parse_id_list(a.input_ids);
    if (!ids.is_ok()) return fail(cmd, ids.status());
    req.prompt_ids = std::move(ids).value();
  } else if (a.chat) {
    req.messages.push_back({"user", a.prompt});
  } else {
    req.prompt = a.prompt;
  }
  if (!a.stop_token_ids.empty()) {
    auto ids = parse_id_list(a.stop_token_ids);
    if (!ids.is_ok()) return fail(cmd, ids.status());
    req.stop_token_ids = std::move(ids).value();
  }
  req.max_tokens = a.max_new_tokens;
  req.sampling = a.sampling;
  req.stop = a.stop;
  req.ignore_eos = a.ignore_eos;
  req.top_logits = a.top_logits;
  req.priority = a.priority;

  std::vector<std::string> images;
  for (const std::string& path : a.images) {
    auto bytes = read_image_file(path);
    if (!bytes.is_ok()) return fail(cmd, bytes.status());
    images.push_back(std::move(bytes).value());
  }

  auto endpoint = server_endpoint(a.server);
  if (!endpoint.is_ok()) return fail(cmd, endpoint.status());
  auto client = net::SchedulerClient::connect(*endpoint);
  if (!client.is_ok()) return fail(cmd, client.status());
  if (Status st = (*client)->wait_connected(kConnectTimeoutMs); !st) return fail(cmd, st);
  const bool stream = !a.json;
  auto done = (*client)->generate(
      std::move(req),
      [&](const proto::GenerateChunk& chunk) {
        if (stream && !chunk.text.empty()) {
          std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
          std::fflush(stdout);
        }
      },
      a.timeout_ms, images);
  if (!done.is_ok()) {
    if (stream) std::printf("\n");
    return fail(cmd, done.status());
  }
  if (a.json) {
    nlohmann::json j;
    j["output_ids"] = done->token_ids;
    j["finish_reason"] = done->finish_reason;
    j["n_prompt_tokens"] = done->n_prompt_tokens;
    j["n_cached_tokens"] = done->n_cached_tokens;
    if (a.top_logits > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, value] : done->top_logits) top.push_back({id, value});
      j["top_logits"] = top;
    }
    j["text"] = done->text;
    j["seconds"] = done->total_seconds;
    j["time_to_first_token_seconds"] = done->first_token_seconds;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace litellama::cli
