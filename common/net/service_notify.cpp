#include "common/net/service_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace litellama::net {

namespace {

// sd_notify's status text is one line: newlines would start new assignments.
std::string one_line(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

void send(const std::string& state) {
  if (notify_enabled()) (void)sd_notify(0, state.c_str());
}

std::string with_status(std::string state, std::string_view status) {
  if (!status.empty()) state += "\nSTATUS=" + one_line(status);
  return state;
}

}  // namespace

bool notify_enabled() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && *socket != '\0';
}

void notify_ready(std::string_view status) {
  send(with_status("READY=1", status));
}

void notify_stopping(std::string_view status) {
  send(with_status("STOPPING=1", status));
}

void notify_status(std::string_view status) {
  send("STATUS=" + one_line(status));
}

void notify_extend_start_timeout(std::chrono::microseconds extra, std::string_view status) {
  send(with_status(fmt::format("EXTEND_TIMEOUT_USEC={}", extra.count()), status));
}

StoppingNotifier::StoppingNotifier(const std::atomic<bool>* stop) {
  if (!notify_enabled()) return;
  // The stop flag is read before done_: a service that drains faster than one poll still sends
  // STOPPING=1 when its run() returns after a signal.
  thread_ = std::thread([this, stop] {
    for (;;) {
      if (stop->load()) {
        notify_stopping("draining");
        return;
      }
      if (done_.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

StoppingNotifier::~StoppingNotifier() {
  done_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace litellama::net
