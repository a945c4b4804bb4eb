// Service manager notifications (systemd's sd_notify protocol, through libsystemd): READY=1 when
// a service is up by itself (its own sockets bound, its model or tokenizer loaded; never waiting
// for peers, so no start order can deadlock), STOPPING=1 when it begins to drain, STATUS= lines
// while it loads, and EXTEND_TIMEOUT_USEC= so a worker loading a large model is not timed out
// while it makes progress. Every call does nothing when the process was not started by a service
// manager that asked for notifications ($NOTIFY_SOCKET unset), as under `litellama serve`.
#pragma once

#include <atomic>
#include <chrono>
#include <string_view>
#include <thread>

namespace litellama::net {

// Whether a service manager listens ($NOTIFY_SOCKET is set).
bool notify_enabled();
void notify_ready(std::string_view status = {});
void notify_stopping(std::string_view status = {});
void notify_status(std::string_view status);
// Asks for `extra` more time to finish starting, counted from now.
void notify_extend_start_timeout(std::chrono::microseconds extra, std::string_view status = {});

// Sends STOPPING=1 once *stop becomes true (the stop signal's flag: a signal handler cannot call
// sd_notify itself). Polls the flag on its own thread only while a service manager listens.
class StoppingNotifier {
 public:
  explicit StoppingNotifier(const std::atomic<bool>* stop);
  ~StoppingNotifier();
  StoppingNotifier(const StoppingNotifier&) = delete;
  StoppingNotifier& operator=(const StoppingNotifier&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace litellama::net
