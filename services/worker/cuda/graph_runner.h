// Decode steps launched as CUDA graphs: capture, keys and replay.
//
// A pure decode step (every sequence brings one token and is sampled) runs through
// GraphRunner::run with a key that names everything its launch configuration depends on
// (ForwardPlan::graph_key). The first step of a new key runs eagerly, outside any capture, so
// that lazy module loading and cuBLAS's heuristics happen there; the second captures the same
// launches into a graph and launches it; later steps of the key replay it. What must stay true
// for a replay to be right: every array the kernels read lives at a device address that depends
// only on the key (the runner's staging layout), the kernels read per-step values (kv_len, the
// slot table, the penalty history) from those arrays and not from launch arguments, and no launch
// configuration depends on anything outside the key. Moving a staging buffer breaks the first
// condition: the runner then calls clear().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "common/status.h"
#include "kernels/gpu_runtime.h"

namespace litellama {

// One instantiated graph; destroys it.
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  GraphExec(GraphExec&& o) noexcept;
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec() { reset(); }
  cudaGraphExec_t get() const { return exec_; }

 private:
  void reset();
  cudaGraphExec_t exec_ = nullptr;
};

class GraphRunner {
 public:
  // Keeps at most max_graphs captured graphs; the least recently used is dropped beyond that.
  explicit GraphRunner(size_t max_graphs) : max_graphs_(max_graphs) {}

  // Runs `kernels` (which enqueue the step's launches on `stream`) for a step of `key`: eagerly,
  // captured, or as a replay, as the top of this file says. A capture the runtime refuses leaves
  // the kernels correct when launched directly: graphs are then off for good (available() turns
  // false, with a warning) and this step runs eagerly.
  Status run(uint64_t key, cudaStream_t stream, const std::function<Status()>& kernels);

  // False once a capture failed: callers then run every step eagerly.
  bool available() const { return !failed_; }
  // Drops every graph (the arrays they read moved).
  void clear() { graphs_.clear(); }

  int64_t replays() const { return replays_; }    // steps launched from an earlier capture
  int64_t captures() const { return captures_; }  // steps that captured their graph

 private:
  struct Entry {
    GraphExec exec;  // empty until the key's second step captures it
    uint64_t last_use = 0;
  };
  Status capture(cudaStream_t stream, const std::function<Status()>& kernels, GraphExec* exec);
  void evict_oldest();

  size_t max_graphs_;
  std::unordered_map<uint64_t, Entry> graphs_;
  uint64_t clock_ = 0;
  bool failed_ = false;
  int64_t replays_ = 0;
  int64_t captures_ = 0;
};

}  // namespace litellama
