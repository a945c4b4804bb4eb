// The current device's launch facts (compute capability, multiprocessor count), read once per
// device.
#include "kernels/launch.h"

#include <atomic>

namespace litellama {
namespace {

struct DeviceFacts {
  bool sm90 = false;  // compute capability 9.0+: programmatic launch, clusters
  int sm_count = 0;
};

// Cached per device ordinal (this process uses few devices; 64 covers any host). A fact is
// packed into one atomic word: 0 unknown, else sm_count << 1 | compute capability 9.0+.
DeviceFacts current_device_facts() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    (void)cudaGetLastError();
    return {};
  }
  int packed = cached[device].load(std::memory_order_relaxed);
  if (packed == 0) {
    int major = 0, sms = 0;
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
    if (!ok) {
      (void)cudaGetLastError();
      return {};
    }
    packed = (sms << 1) | (major >= 9 ? 1 : 0);
    cached[device].store(packed, std::memory_order_relaxed);
  }
  return DeviceFacts{(packed & 1) != 0, packed >> 1};
}

}  // namespace

// Portable builds (kernels/gpu_runtime.h) use neither: HIP has no form of them, and an AMD GPU's
// compute capability major (9 on gfx90a) says nothing about them.
bool current_device_supports_programmatic_launch() {
  return !LITELLAMA_PORTABLE_KERNELS && current_device_facts().sm90;
}

int current_device_sm_count() {
  return current_device_facts().sm_count;
}

bool current_device_supports_clusters() {
  return !LITELLAMA_PORTABLE_KERNELS && current_device_facts().sm90;
}

}  // namespace litellama
