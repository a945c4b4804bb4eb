// The run directory of the ipc:// endpoints and the guard on each listening endpoint.
//
// The run directory holds the sockets that carry every prompt and answer, so it must be private
// to the service user (and its group, which may be given client access): services create it 0750
// and refuse one that is a symlink, belongs to another user, or that the group or others can
// write (anyone who can write it can replace client.sock and read prompts or forge answers).
// The default is per user ($XDG_RUNTIME_DIR/litellama, else /tmp/litellama-UID), never a shared
// predictable path.
//
// A listening endpoint is guarded by an exclusive flock(2) on PATH.lock beside its socket, held
// for the listener's lifetime: a second scheduler on the same run dir is refused instead of
// silently unlinking and rebinding the first one's sockets (which ZeroMQ's ipc transport would
// do). A lock that can be taken means no live listener; a socket file left behind by a dead one is
// then removed. Lock files stay in place (unlinking them would let two processes hold locks on
// two different files of one name).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace litellama::net {

// $XDG_RUNTIME_DIR/litellama when XDG_RUNTIME_DIR is an absolute path, else /tmp/litellama-UID.
std::string default_run_dir();

// Services: creates `dir` (0750) when missing and checks that it is a real directory owned by
// this user that neither its group nor others can write.
Status prepare_run_dir(const std::string& dir);

// Clients: checks the directory of an ipc:// endpoint before sending prompts through it. Refused:
// a directory others can write; with require_owner (the default, per-user path, where a directory
// created by someone else is an attack) one that belongs to another user. A missing directory is
// fine here (connecting reports that nothing listens).
Status check_client_run_dir(const std::string& dir, bool require_owner);

// The directory part of an ipc:// endpoint ("" for tcp:// or a bare file name).
std::string ipc_dir(const std::string& endpoint);

class ListenerLock {
 public:
  // ipc://PATH: takes the lock on PATH.lock (kUnavailable, naming the holder's pid, when another
  // process holds it), then removes a stale PATH. tcp://: nothing to guard (the kernel refuses a
  // second bind of a port), returns an empty lock.
  static Result<std::unique_ptr<ListenerLock>> acquire(const std::string& endpoint);
  ~ListenerLock();
  ListenerLock(const ListenerLock&) = delete;
  ListenerLock& operator=(const ListenerLock&) = delete;

 private:
  ListenerLock() = default;
  int fd_ = -1;
};

// After binding ipc://PATH: the socket file becomes 0660 (the service user and its group).
Status restrict_ipc_socket(const std::string& endpoint);

}  // namespace litellama::net
