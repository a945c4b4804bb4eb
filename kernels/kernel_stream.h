// What every kernel launcher of this directory takes instead of a bare stream: the stream it
// enqueues on and whether its kernels are launched with programmatic dependent launch (PDL,
// kernels/launch.h). The choice travels with each call, so no launch depends on global or
// per-thread state. PDL is honoured only where the device supports it (compute capability 9.0+)
// and ignored elsewhere. A bare stream converts to a KernelStream without PDL.
#pragma once

#include "kernels/gpu_runtime.h"

namespace litellama {

struct KernelStream {
  cudaStream_t stream = nullptr;
  bool programmatic = false;

  KernelStream() = default;
  // Implicit on purpose: a launcher called with a plain stream launches without PDL.
  KernelStream(cudaStream_t s, bool pdl = false) : stream(s), programmatic(pdl) {}  // NOLINT
};

}  // namespace litellama
