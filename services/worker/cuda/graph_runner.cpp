// GraphRunner: see graph_runner.h.
#include "services/worker/cuda/graph_runner.h"

#include <utility>

#include "common/log.h"
#include "kernels/cuda_check.h"

namespace litellama {

GraphExec::GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}

GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    reset();
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void GraphExec::reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

void GraphRunner::evict_oldest() {
  auto oldest = graphs_.begin();
  for (auto g = graphs_.begin(); g != graphs_.end(); ++g) {
    if (g->second.last_use < oldest->second.last_use) oldest = g;
  }
  graphs_.erase(oldest);
}

Status GraphRunner::run(uint64_t key, cudaStream_t stream, const std::function<Status()>& kernels) {
  if (failed_) return kernels();
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= max_graphs_) evict_oldest();
    graphs_[key].last_use = ++clock_;
    return kernels();  // first sight: eager, outside any capture
  }
  Entry& entry = it->second;
  entry.last_use = ++clock_;
  const bool replay = entry.exec.get() != nullptr;
  if (!replay && !capture(stream, kernels, &entry.exec).is_ok()) {
    (void)cudaGetLastError();
    LITELLAMA_LOG_WARN("CUDA graphs off: a decode graph capture failed; steps run eagerly");
    failed_ = true;
    graphs_.clear();
    return kernels();
  }
  ++(replay ? replays_ : captures_);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(entry.exec.get(), stream));
  return Status::ok();
}

Status GraphRunner::capture(cudaStream_t stream, const std::function<Status()>& kernels,
                            GraphExec* exec) {
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status recorded = kernels();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!recorded.is_ok()) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    return recorded;
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t instance = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&instance, graph, 0);
  (void)cudaGraphDestroy(graph);
  LITELLAMA_CUDA_RETURN_IF_ERROR(made);
  *exec = GraphExec(instance);
  return Status::ok();
}

}  // namespace litellama
