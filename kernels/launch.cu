// Per-thread switch and per-device capability check of programmatic dependent launch.
#include "kernels/launch.h"

#include <atomic>

namespace litellama {
namespace {

thread_local bool g_programmatic_launch = true;

bool device_supports_programmatic_launch() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // Cached per device ordinal (this process uses few devices; 64 covers any host).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= kMaxDevices) return false;
  int state = cached[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    state = ok && major >= 9 ? 1 : 2;
    cached[device].store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

}  // namespace

bool programmatic_launch_enabled() {
  return g_programmatic_launch && device_supports_programmatic_launch();
}

void set_programmatic_launch_enabled(bool on) {
  g_programmatic_launch = on;
}

}  // namespace litellama
