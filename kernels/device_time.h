// The GPU's own clock, read by kernels on a stream: timestamps that two processes on the same GPU
// can compare (the vision service stamps when an image's rows are complete, the worker when its
// prefill starts reading them). CUDA's %globaltimer is one nanosecond counter per GPU, shared by
// every context on it; portable (HIP) builds have no such counter here and write 0, which readers
// take as "not measured" (device_time_supported() says which).
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool device_time_supported();

// When the stream reaches it: *dst = the GPU's nanosecond time (0 where unsupported). dst may be
// device memory, another process's mapped device memory, or page-locked host memory.
Status launch_write_device_time(uint64_t* dst, KernelStream stream);

// When the stream reaches it: *elapsed_ns = the GPU's time minus *since (0 when *since is 0 or
// ahead, or where unsupported). Reads *since then, so a stamp written earlier on another stream or
// in another process counts once that work has completed.
Status launch_device_time_since(const uint64_t* since, int64_t* elapsed_ns, KernelStream stream);

}  // namespace litellama
