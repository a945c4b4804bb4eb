// Block timeline (see block_trace.h): the registry of the translation units' trace targets and
// the device buffer of one trace.
#include "kernels/block_trace.h"

#include <algorithm>
#include <mutex>

#include "kernels/cuda_check.h"

namespace litellama {
namespace {

struct TraceState {
  std::mutex mu;
  std::vector<block_trace_detail::Setter> setters;
  BlockTraceRecord* records = nullptr;
  unsigned long long* count = nullptr;
  int64_t capacity = 0;
};

TraceState& state() {
  static TraceState s;
  return s;
}

Status set_all(TraceState& s, const block_trace_detail::Target& target) {
  for (const auto set : s.setters) LITELLAMA_CUDA_RETURN_IF_ERROR(set(target));
  return Status::ok();
}

void free_buffers(TraceState& s) {
  if (s.records != nullptr) (void)cudaFree(s.records);
  if (s.count != nullptr) (void)cudaFree(s.count);
  s.records = nullptr;
  s.count = nullptr;
  s.capacity = 0;
}

}  // namespace

bool block_trace_compiled() {
#if LITELLAMA_BLOCK_TRACE
  return true;
#else
  return false;
#endif
}

Status block_trace_start(int64_t capacity) {
  if (!block_trace_compiled()) {
    return make_error(StatusCode::kUnsupported,
                      "block trace: the kernels were built without LITELLAMA_PROFILING");
  }
  if (capacity <= 0) {
    return make_error(StatusCode::kInvalidArgument, "block trace: capacity {} <= 0", capacity);
  }
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  free_buffers(s);
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&s.records, static_cast<size_t>(capacity) * sizeof(BlockTraceRecord)));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&s.count, sizeof(unsigned long long)));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemset(s.count, 0, sizeof(unsigned long long)));
  s.capacity = capacity;
  LITELLAMA_RETURN_IF_ERROR(
      set_all(s, {s.records, s.count, static_cast<unsigned long long>(capacity)}));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

Result<std::vector<BlockTraceRecord>> block_trace_stop(int64_t* dropped) {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.records == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "block trace: not started");
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  LITELLAMA_RETURN_IF_ERROR(set_all(s, {nullptr, nullptr, 0}));
  unsigned long long count = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&count, s.count, sizeof count, cudaMemcpyDeviceToHost));
  const auto kept = static_cast<int64_t>(
      std::min<unsigned long long>(count, static_cast<unsigned long long>(s.capacity)));
  std::vector<BlockTraceRecord> out(static_cast<size_t>(kept));
  if (kept > 0) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        out.data(), s.records, out.size() * sizeof(BlockTraceRecord), cudaMemcpyDeviceToHost));
  }
  if (dropped != nullptr) *dropped = static_cast<int64_t>(count) - kept;
  free_buffers(s);
  return out;
}

namespace block_trace_detail {
bool register_setter(Setter set) {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.setters.push_back(set);
  return true;
}
}  // namespace block_trace_detail

}  // namespace litellama
