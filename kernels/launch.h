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

#include <cuda_runtime.h>

#include <utility>

namespace litellama {

// Whether launch_kernel() sets the PDL attribute on this thread: on by default where the current
// device supports it (compute capability 9.0+), off otherwise whatever was asked.
bool programmatic_launch_enabled();
void set_programmatic_launch_enabled(bool on);

// Multiprocessors of the current device (0 when it cannot be read), read once per device.
int current_device_sm_count();

// Whether the current device runs thread-block clusters (compute capability 9.0+).
bool current_device_supports_clusters();

// Launches `kernel` on `stream`, with the PDL attribute where enabled.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// launch_kernel() with the grid's x dimension grouped into thread-block clusters of cluster_x
// blocks (which must divide grid.x; compute capability 9.0+).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_clustered(void (*kernel)(Params...), dim3 grid, dim3 block,
                                    size_t smem_bytes, cudaStream_t stream, unsigned cluster_x,
                                    Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster_x;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = programmatic_launch_enabled() ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace litellama
