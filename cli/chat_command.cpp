// litellama chat: an interactive, streaming conversation with a running scheduler (or with
// services it starts itself, --start-services). Keeps the history; the scheduler's tokenizer
// applies the model's chat template. /reset forgets the history, /exit (or end of input) quits,
// Ctrl-C stops the answer being written.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/generate_remote.h"
#include "cli/service_launcher.h"
#include "common/cli_option.h"
#include "common/net/scheduler_client.h"
#include "common/net/stop_signal.h"

namespace litellama::cli {

namespace {

std::atomic<bool> g_interrupt{false};

struct ChatArgs {
  std::string server;
  bool start_services = false;
  LaunchOptions launch;
  std::string system;
  std::vector<std::string> messages;  // non-interactive: one turn per --message
  // Image files of a LLaVA model: "<image>" lines open the first user turn, and every turn
  // sends the images again with the history that holds them.
  std::vector<std::string> image_paths;
  std::vector<std::string> images;  // their bytes
  int32_t max_new_tokens = 256;
  SamplingParams sampling;  // --temperature, --top-p, --seed
  int32_t timeout_ms = 120000;
};

// One assistant turn, streamed to stdout. Returns the reply text.
Result<std::string> chat_turn(net::SchedulerClient& client, const ChatArgs& a,
                              const std::vector<proto::ChatMessage>& history) {
  proto::GenerateRequest req;
  req.messages = history;
  req.max_tokens = a.max_new_tokens;
  req.sampling = a.sampling;
  LITELLAMA_ASSIGN_OR_RETURN(uint64_t id, client.submit(std::move(req), a.images));
  std::string reply;
  g_interrupt.store(false);
  bool aborted = false;
  while (true) {
    if (g_interrupt.exchange(false) && !aborted) {
      aborted = true;
      (void)client.abort(id);
    }
    LITELLAMA_ASSIGN_OR_RETURN(std::optional<net::ClientEvent> event, client.next_event(100));
    if (!event || event->request_id() != id) continue;
    if (event->kind == net::ClientEvent::Kind::kError) {
      return Status(StatusCode::kUnavailable, event->error.message);
    }
    reply += event->chunk.text;
    std::fwrite(event->chunk.text.data(), 1, event->chunk.text.size(), stdout);
    std::fflush(stdout);
    if (event->chunk.finished) break;
  }
  std::printf("\n");
  return reply;
}

int run_chat(ChatArgs a) {
  const char* cmd = "chat";
  for (const std::string& path : a.image_paths) {
    auto bytes = read_image_file(path);
    if (!bytes.is_ok()) return fail(cmd, bytes.status());
    a.images.push_back(std::move(bytes).value());
  }
  std::unique_ptr<ServiceLauncher> launcher;
  auto resolved = server_endpoint(a.server);
  if (!resolved.is_ok()) return fail(cmd, resolved.status());
  std::string endpoint = *resolved;
  if (a.start_services) {
    if (a.launch.model_dir.empty()) {
      auto dir = default_model_dir();
      if (!dir.is_ok()) return fail(cmd, dir.status());
      a.launch.model_dir = *dir;
    }
    if (a.launch.log_dir.empty()) a.launch.log_dir = a.launch.run_dir + "/logs";
    launcher = std::make_unique<ServiceLauncher>(a.launch);
    if (Status st = launcher->start(); !st) return fail(cmd, st);
    std::fprintf(stderr, "litellama chat: starting the services (logs in %s) ...\n",
                 a.launch.log_dir.c_str());
    if (Status st = launcher->wait_ready(300000); !st) return fail(cmd, st);
    endpoint = launcher->client_endpoint();
  }
  auto client = net::SchedulerClient::connect(endpoint);
  if (!client.is_ok()) return fail(cmd, client.status());
  if (Status st = (*client)->wait_connected(kConnectTimeoutMs); !st) return fail(cmd, st);
  if (Status st = (*client)->wait_ready(a.start_services ? 5000 : 30000); !st) {
    return fail(cmd, st);
  }
  net::install_stop_signal(&g_interrupt);

  std::vector<proto::ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  std::string image_lines;
  for (size_t i = 0; i < a.images.size(); ++i) image_lines += "<image>\n";
  auto turn = [&](const std::string& text) -> Status {
    const bool first = std::none_of(history.begin(), history.end(),
                                    [](const proto::ChatMessage& m) { return m.role == "user"; });
    proto::ChatMessage user{"user", first ? image_lines + text : text, {}};
    if (first && !a.images.empty()) {
      // As typed parts too, for templates that read them (images first, as LLaVA's place them).
      for (size_t i = 0; i < a.images.size(); ++i) user.parts.push_back({"image", ""});
      user.parts.push_back({"text", text});
    }
    history.push_back(std::move(user));
    auto reply = chat_turn(**client, a, history);
    if (!reply.is_ok()) {
      history.pop_back();
      return reply.status();
    }
    history.push_back({"assistant", *reply});
    return Status::ok();
  };

  if (!a.messages.empty()) {
    for (const std::string& m : a.messages) {
      if (Status st = turn(m); !st) return fail(cmd, st);
    }
    return 0;
  }
  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty) std::fprintf(stderr, "(/reset clears the history, /exit quits)\n");
  std::string line;
  while (true) {
    if (tty) {
      std::fprintf(stderr, "> ");
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.clear();
      if (!a.system.empty()) history.push_back({"system", a.system});
      continue;
    }
    if (line.empty()) continue;
    if (Status st = turn(line); !st) {
      std::fprintf(stderr, "litellama chat: error: %s\n", st.message().c_str());
    }
  }
  return 0;
}

}  // namespace

CommandMain register_chat_command(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "interactive streaming chat with the served model");
  sub->add_option("--server", a->server, "scheduler address (default: litellama serve's)");
  sub->add_flag("--start-services", a->start_services,
                "start the services for this chat and stop them after");
  add_launch_options(sub, &a->launch);
  sub->add_option("--system", a->system, "system prompt");
  sub->add_option("--message,-m", a->messages,
                  "send this user message and print the answer (repeatable; no prompt)");
  sub->add_option("--image", a->image_paths,
                  "an image file (JPEG/PNG) for a LLaVA model, placed at the start of the first "
                  "user turn (repeatable)");
  add_bounded_option(*sub, "--max-new-tokens", a->max_new_tokens, "tokens per answer", 1, 1 << 20);
  sub->add_option("--temperature", a->sampling.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", a->sampling.top_p, "1 = off")->capture_default_str();
  sub->add_option("--seed", a->sampling.seed, "sampling seed");
  return [a] { return run_chat(*a); };
}

}  // namespace litellama::cli
