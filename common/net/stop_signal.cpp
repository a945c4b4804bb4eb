#include "common/net/stop_signal.h"

#include <unistd.h>
#include <csignal>

namespace litellama::net {

namespace {

// Read by the handler, so an atomic (lock-free, hence async-signal-safe) pointer.
std::atomic<std::atomic<bool>*> g_flag{nullptr};
static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free);

extern "C" void on_signal(int) {
  std::atomic<bool>* flag = g_flag.load();
  if (flag == nullptr) _exit(130);
  if (flag->exchange(true)) _exit(130);
}

}  // namespace

void detach_stop_signal() {
  g_flag.store(nullptr);
}

void install_stop_signal(std::atomic<bool>* flag) {
  g_flag.store(flag);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace litellama::net
