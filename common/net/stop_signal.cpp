#include "common/net/stop_signal.h"

#include <unistd.h>
#include <csignal>

namespace litellama::net {

namespace {

std::atomic<bool>* g_flag = nullptr;

extern "C" void on_signal(int) {
  if (g_flag == nullptr) _exit(130);
  if (g_flag->exchange(true)) _exit(130);
}

}  // namespace

void install_stop_signal(std::atomic<bool>* flag) {
  g_flag = flag;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace litellama::net
