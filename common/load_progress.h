// LoadProgress: start-up progress on stderr while a service loads something large (the worker's
// weights): a bar redrawn in place when stderr is a terminal, plain lines at every tenth of the
// way otherwise (a log file, journald), so neither a terminal nor a log is flooded. Each plain
// report also goes to a listener (the worker passes it to the service manager as STATUS= with
// EXTEND_TIMEOUT_USEC=, so a load that makes progress is never timed out).
//
// Thread-compatible: one thread reports (the loading thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace litellama {

// "1.5 GiB", "22.3 MiB", "512 B".
std::string format_bytes(int64_t bytes);

class LoadProgress {
 public:
  using Listener = std::function<void(const std::string& line)>;

  // `what` names the work ("weights"); total_bytes and n_shards are what add() counts up to.
  // `terminal`: draw a bar (default: whether stderr is a terminal).
  LoadProgress(std::string what, int64_t total_bytes, int32_t n_shards, Listener listener = {});
  LoadProgress(std::string what, int64_t total_bytes, int32_t n_shards, Listener listener,
               bool terminal);
  ~LoadProgress();

  // `bytes` more are done, from shard `shard` (0-based); shards complete in any order.
  void add(int64_t bytes, int32_t shard);
  void shard_done(int32_t shard);
  // Ends the bar (once): a final line with what was done and how long it took.
  void finish();

  int64_t done_bytes() const { return done_bytes_; }
  int32_t n_shards_done() const { return n_shards_done_; }
  // The last plain line reported (tests).
  const std::string& last_line() const { return last_line_; }

 private:
  std::string line() const;
  void report(bool force);

  std::string what_;
  int64_t total_bytes_;
  int32_t n_shards_;
  Listener listener_;
  bool terminal_;
  int64_t done_bytes_ = 0;
  int32_t n_shards_done_ = 0;
  int32_t last_tenth_ = -1;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  std::string last_line_;
};

}  // namespace litellama
