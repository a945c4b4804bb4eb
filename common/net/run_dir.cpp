#include "common/net/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace litellama::net {

namespace {

constexpr std::string_view kIpc = "ipc://";

Status check_owned_private(const std::string& dir, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) {
    return make_error(StatusCode::kInvalidArgument,
                      "run directory '{}' is not a directory (or is a symlink)", dir);
  }
  if (st.st_uid != ::geteuid()) {
    return make_error(StatusCode::kInvalidArgument,
                      "run directory '{}' belongs to uid {}, not to this user (uid {}); remove it "
                      "or pass --run-dir with a directory of your own",
                      dir, st.st_uid, ::geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "run directory '{}' is writable by its group or others (mode {:o}); make it "
                      "0750 (chmod 750 '{}')",
                      dir, st.st_mode & 07777, dir);
  }
  return Status::ok();
}

// True when something accepts connections on the unix socket at `path`.
bool unix_socket_answers(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool answers = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return answers;
}

}  // namespace

std::string default_run_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/litellama";
  return "/tmp/litellama-" + std::to_string(::geteuid());
}

Status prepare_run_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return make_error(StatusCode::kUnavailable, "cannot inspect run directory '{}': {}", dir,
                        std::strerror(errno));
    }
    // Parents are made as the user's umask says; the run directory itself is 0750 whatever the
    // umask, since it is what protects the sockets.
    const size_t slash = dir.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      std::string parent = dir.substr(0, slash);
      for (size_t at = 1; at <= parent.size(); ++at) {
        if (at == parent.size() || parent[at] == '/') {
          const std::string prefix = parent.substr(0, at);
          if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
            return make_error(StatusCode::kUnavailable, "cannot create '{}': {}", prefix,
                              std::strerror(errno));
          }
        }
      }
    }
    if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
      return make_error(StatusCode::kUnavailable, "cannot create run directory '{}': {}", dir,
                        std::strerror(errno));
    }
    if (::chmod(dir.c_str(), 0750) != 0 && errno != EPERM) {
      return make_error(StatusCode::kUnavailable, "cannot chmod run directory '{}': {}", dir,
                        std::strerror(errno));
    }
    if (::lstat(dir.c_str(), &st) != 0) {
      return make_error(StatusCode::kUnavailable, "cannot inspect run directory '{}': {}", dir,
                        std::strerror(errno));
    }
  }
  return check_owned_private(dir, st);
}

Status check_client_run_dir(const std::string& dir, bool require_owner) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status::ok();
  if ((st.st_mode & S_IWOTH) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "refusing '{}': any user can write it (mode {:o}), so anyone could stand in "
                      "for the server",
                      dir, st.st_mode & 07777);
  }
  if (require_owner && st.st_uid != ::geteuid()) {
    return make_error(StatusCode::kInvalidArgument,
                      "refusing '{}': it belongs to uid {}, not to this user (uid {})", dir,
                      st.st_uid, ::geteuid());
  }
  return Status::ok();
}

std::string ipc_dir(const std::string& endpoint) {
  if (endpoint.rfind(kIpc, 0) != 0) return "";
  const std::string path = endpoint.substr(kIpc.size());
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Result<std::unique_ptr<ListenerLock>> ListenerLock::acquire(const std::string& endpoint) {
  std::unique_ptr<ListenerLock> lock(new ListenerLock());
  if (endpoint.rfind(kIpc, 0) != 0) return lock;
  const std::string path = endpoint.substr(kIpc.size());
  const std::string lock_path = path + ".lock";
  lock->fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock->fd_ < 0) {
    return make_error(StatusCode::kUnavailable, "cannot open lock file '{}': {}", lock_path,
                      std::strerror(errno));
  }
  if (::flock(lock->fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    (void)!::pread(lock->fd_, holder, sizeof(holder) - 1, 0);
    const std::string pid = std::string(holder).substr(0, std::string(holder).find('\n'));
    return make_error(StatusCode::kUnavailable,
                      "{} is already served by another process (pid {}, holding '{}'); stop it or "
                      "use another --run-dir",
                      endpoint, pid.empty() ? "unknown" : pid, lock_path);
  }
  // Holding the lock, no listener of ours can be live; a server of another build that does not
  // take the lock still answers a connect, and is refused the same way.
  if (unix_socket_answers(path)) {
    return make_error(StatusCode::kUnavailable,
                      "{} is already served by another process (it accepts connections); stop it "
                      "or use another --run-dir",
                      endpoint);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock->fd_, 0) == 0) (void)!::pwrite(lock->fd_, pid.data(), pid.size(), 0);
  // A socket file left by a dead listener.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return make_error(StatusCode::kUnavailable, "cannot remove the stale socket '{}': {}", path,
                      std::strerror(errno));
  }
  return lock;
}

ListenerLock::~ListenerLock() {
  if (fd_ >= 0) ::close(fd_);
}

Status restrict_ipc_socket(const std::string& endpoint) {
  if (endpoint.rfind(kIpc, 0) != 0) return Status::ok();
  const std::string path = endpoint.substr(kIpc.size());
  if (::chmod(path.c_str(), 0660) != 0) {
    return make_error(StatusCode::kUnavailable, "cannot chmod '{}': {}", path,
                      std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace litellama::net
