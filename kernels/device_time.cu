// GPU timestamps (kernels/device_time.h): one thread reads the clock.
#include "kernels/device_time.h"

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

__device__ __forceinline__ uint64_t device_now_ns() {
#if defined(__CUDA_ARCH__) && !LITELLAMA_HIP
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return 0;
#endif
}

__global__ void write_device_time_kernel(uint64_t* dst) {
  pdl_wait();
  *dst = device_now_ns();
}

__global__ void device_time_since_kernel(const uint64_t* since, int64_t* elapsed_ns) {
  pdl_wait();
  const uint64_t now = device_now_ns();
  // volatile: the stamp is another stream's (or process's) write, ordered before this read by
  // the event the caller waited on, never by this kernel's own stream.
  const uint64_t then = *static_cast<const volatile uint64_t*>(since);
  *elapsed_ns = (then == 0 || now == 0 || then > now) ? 0 : static_cast<int64_t>(now - then);
}

}  // namespace

bool device_time_supported() {
#if LITELLAMA_HIP
  return false;
#else
  return true;
#endif
}

Status launch_write_device_time(uint64_t* dst, KernelStream stream) {
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel(write_device_time_kernel, dim3(1), dim3(1), 0, stream, dst));
  return Status::ok();
}

Status launch_device_time_since(const uint64_t* since, int64_t* elapsed_ns, KernelStream stream) {
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel(device_time_since_kernel, dim3(1), dim3(1), 0, stream, since, elapsed_ns));
  return Status::ok();
}

}  // namespace litellama
