// Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A kernel launched with the programmatic-stream-serialization attribute may start while the
// kernel before it in the stream is still running. Every kernel of this directory that is
// launched through launch_kernel() obeys one rule that keeps this correct:
//   - before pdl_wait() (griddepcontrol.wait) it touches only data no kernel writes (weights)
//     and writes nothing (one exception: attention_decode.h's early K/V reads);
//   - every block reaches pdl_wait() before it reads or writes activations (same exception), and
//     before it exits (so a grid never completes ahead of the grid it depends on, which keeps the
//     ordering transitive along the stream);
//   - pdl_launch_dependents() (griddepcontrol.launch_dependents) lets the next kernel start its
//     own weight loads early; its pdl_wait() still waits for this grid's completion and memory.
// Kernels launched without the attribute (cuBLAS, copies) order as usual. Captured into a CUDA
// graph, the attribute becomes a programmatic edge, so decode graphs keep the overlap.
#pragma once

#include <tuple>
#include <utility>

#include "kernels/gpu_runtime.h"

#include "kernels/kernel_stream.h"

namespace litellama {

// Whether the current device runs programmatic dependent launch (compute capability 9.0+).
bool current_device_supports_programmatic_launch();

// Multiprocessors of the current device (0 when it cannot be read), read once per device.
int current_device_sm_count();

// Whether the current device runs thread-block clusters (compute capability 9.0+).
bool current_device_supports_clusters();

// What a launch may ask beyond its grid: thread-block clusters of cluster_x blocks along x (which
// must divide grid.x; compute capability 9.0+; 0: not a cluster launch), and the shared memory each
// multiprocessor sets aside, in percent of the most
// (cudaLaunchAttributePreferredSharedMemoryCarveout, kept by a CUDA graph's kernel node; negative,
// or a toolkit before 12.6: the kernel's own attribute).
struct LaunchShape {
  unsigned cluster_x = 0;
  int carveout_percent = -1;
};

// Launches `kernel` on `stream` with `shape`, with the PDL attribute when the stream asks for it
// and the device supports it.
#if LITELLAMA_HIP
// HIP: no launch attributes (PDL, clusters and the carveout are CUDA's); the arguments convert to
// the kernel's parameter types as a <<<>>> launch converts them.
template <typename... Params, typename... Args>
cudaError_t launch_kernel_shaped(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t smem_bytes, KernelStream stream, LaunchShape /*shape*/,
                                 Args&&... args) {
  std::tuple<std::decay_t<Params>...> values(std::forward<Args>(args)...);
  return std::apply(
      [&](auto&... v) {
        void* pointers[] = {static_cast<void*>(&v)...};
        return hipLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, pointers,
                               smem_bytes, stream.stream);
      },
      values);
}
#else
template <typename... Params, typename... Args>
cudaError_t launch_kernel_shaped(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t smem_bytes, KernelStream stream, LaunchShape shape,
                                 Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream.stream;
  cudaLaunchAttribute attributes[3]{};
  unsigned n = 0;
  if (stream.programmatic && current_device_supports_programmatic_launch()) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (shape.cluster_x > 0) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n].val.clusterDim.x = shape.cluster_x;
    attributes[n].val.clusterDim.y = 1;
    attributes[n++].val.clusterDim.z = 1;
  }
#if CUDART_VERSION >= 12060  // older toolkits lack the attribute: the kernel's own carveout holds
  if (shape.carveout_percent >= 0) {
    attributes[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attributes[n++].val.sharedMemCarveout = static_cast<unsigned>(shape.carveout_percent);
  }
#endif
  config.attrs = attributes;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
#endif

// Launches `kernel` on `stream` (PDL as the stream asks, where supported).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                          KernelStream stream, Args&&... args) {
  return launch_kernel_shaped(kernel, grid, block, smem_bytes, stream, LaunchShape{},
                              std::forward<Args>(args)...);
}

// launch_kernel() with the grid's x dimension grouped into thread-block clusters of cluster_x
// blocks (which must divide grid.x; compute capability 9.0+).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_clustered(void (*kernel)(Params...), dim3 grid, dim3 block,
                                    size_t smem_bytes, KernelStream stream, unsigned cluster_x,
                                    Args&&... args) {
  return launch_kernel_shaped(kernel, grid, block, smem_bytes, stream, LaunchShape{cluster_x, -1},
                              std::forward<Args>(args)...);
}

}  // namespace litellama
