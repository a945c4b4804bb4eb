// ChildProcess: a spawned program (fork + exec) the launcher and the integration tests supervise.
// The child gets its own process group so a signal aimed at it reaches nothing else, and it gets
// SIGTERM when the process that spawned it dies: a launcher killed outright (SIGKILL, a timeout)
// must not leave services behind that hold its sockets, shared memory and metrics ports.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace litellama::net {

// Exit status of a service whose configuration cannot work (its metrics port is taken, its
// endpoint cannot be bound): restarting it would fail the same way, so supervisors (serve, the
// systemd units' RestartPreventExitStatus) leave it down and report it. Same value as sysexits'
// EX_CONFIG.
inline constexpr int kExitConfigError = 78;

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv. stdout/stderr are inherited, or appended to log_path.
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv,
                                    const std::string& log_path = "");

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  // Reaps without blocking; the exit status once the child is gone.
  std::optional<int> poll();
  bool running() { return pid_ > 0 && !poll().has_value(); }
  void signal(int sig);
  // SIGTERM, wait up to grace_ms, then SIGKILL; returns the exit status.
  int stop(int grace_ms = 5000);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Directory of the running executable (where the sibling binaries live).
std::string executable_dir();

}  // namespace litellama::net
