// Block timeline of the decode kernels, for profiling: which multiprocessor each block ran on and
// when it started, when its wait for the previous kernel returned (programmatic dependent launch,
// kernels/launch.h) and when it finished, on the device's global timer (nanoseconds, one clock
// for all multiprocessors). bench/block_timeline.py turns a trace of one decode step into per
// kernel figures: dependency latency, ramp, drain and blocks per multiprocessor.
//
// Compiled in only with the CMake option LITELLAMA_PROFILING (off by default): without it the
// kernels carry no trace code and block_trace_start() returns kUnsupported. With it, a traced
// kernel's thread 0 reads the timer three times and, while a trace is running, appends one record
// per block (one atomic add); between traces it checks a null pointer. Traced: the GEMV kernels
// (gemv.h), the tensor-core decode attention (attention_decode.h; a block of a key split with no
// keys, outside a cluster, returns early and leaves no record) and add_rmsnorm.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/gpu_runtime.h"

namespace litellama {

enum class BlockTraceKernel : uint32_t {
  kGemv = 1,       // one unit per block; variant = epilogue * 16 + k segments
  kGemvLoop = 2,   // looping GEMV; variant as kGemv
  kAttention = 3,  // tensor-core decode attention; variant = 1 in clusters, 2 in a cascade
                   // task of more than 16 rows, 0 otherwise
  kAddRmsNorm = 4,
};

struct BlockTraceRecord {
  uint64_t start_ns;     // the block's first instruction
  uint64_t released_ns;  // its wait for the previous kernel returned
  uint64_t end_ns;       // thread 0 done with the block's work
  uint32_t kernel;       // BlockTraceKernel
  uint32_t variant;
  uint32_t block;  // blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
  uint32_t sm;
  uint32_t n_blocks;  // of the grid
  uint32_t reserved;
};

// True when the kernels were built with LITELLAMA_PROFILING (which sets LITELLAMA_BLOCK_TRACE).
bool block_trace_compiled();

// Starts recording up to `capacity` blocks (later blocks are counted, not recorded). Synchronizes
// the device. Records of blocks already running are not guaranteed.
Status block_trace_start(int64_t capacity);

// Synchronizes the device, stops recording and returns the records in the order blocks finished.
// *dropped (if not null) receives the number of blocks past the capacity.
Result<std::vector<BlockTraceRecord>> block_trace_stop(int64_t* dropped = nullptr);

namespace block_trace_detail {
// Where the traced kernels of one translation unit append (records null: not tracing).
struct Target {
  BlockTraceRecord* records;
  unsigned long long* count;
  unsigned long long capacity;
};
using Setter = cudaError_t (*)(const Target&);
// Each translation unit with traced kernels registers the setter of its own device variable
// (kernel_common.cuh does this); block_trace_start/stop call them all.
bool register_setter(Setter set);
}  // namespace block_trace_detail

}  // namespace litellama
