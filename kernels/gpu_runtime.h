// The one portability layer between the GPU code of this project and its two runtimes: CUDA
// (nvcc, cuBLAS) and HIP (ROCm's hipcc, AMD GPUs; a LITELLAMA_HIP build). Kernels and host code
// are written once against the CUDA runtime's names; in a HIP build this header maps each name the
// project uses to its HIP equivalent, so a name missing here is a compile error of the HIP build
// (which CI compiles), not a silent difference. It maps
//   - the runtime API: errors, devices, memory, copies, streams, events, graphs, IPC handles,
//     and gpu_device_uuid (the two runtimes read it differently);
//   - the 16-bit float types: gpu_bf16 (__nv_bfloat16 / hip_bfloat16) with its float conversions;
//     __half is the same name in both runtimes;
//   - warp intrinsics, as the project's own gpu_* functions below.
//
// Warps. Every kernel of this project is written for warps of kWarpLanes = 32 lanes: lane =
// threadIdx.x & 31, warp = threadIdx.x >> 5, shuffles over offsets below 32, 32-bit ballots. AMD's
// CDNA GPUs (gfx90a) run wavefronts of 64 lanes; there every gpu_* warp function acts on the
// 32-lane half of the wavefront that the calling lane belongs to (shuffle width 32, the half's
// bits of the 64-bit ballot), so a wavefront executes as two of the project's warps and no kernel
// depends on the hardware width. Block sizes stay multiples of 32 (of 64 for full wavefronts).
//
// What HIP has no form of stays CUDA-only and is compiled out where LITELLAMA_PORTABLE_KERNELS is
// set (always in a HIP build; the CMake option of the same name sets it in a CUDA build, so the
// portable code runs on NVIDIA GPUs in the GPU tests): inline PTX (mma.sync, ldmatrix, cp.async,
// griddepcontrol), thread-block clusters and cuBLAS. Each kernel with such a path keeps its
// launcher and supports() predicate and runs a portable version behind them.
#pragma once

#if LITELLAMA_HIP

#include <hip/hip_bfloat16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

// ---- runtime API --------------------------------------------------------------------------------
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError

#define cudaGetDevice hipGetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMemGetInfo hipMemGetInfo

#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostRegisterDefault hipHostRegisterDefault
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDefault hipMemcpyDefault

#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaStreamWaitEvent hipStreamWaitEvent

#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamCaptureModeGlobal hipStreamCaptureModeGlobal
// CUDA 12's (exec, graph, flags) form.
#define cudaGraphInstantiate hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy

#define cudaIpcMemHandle_t hipIpcMemHandle_t
#define cudaIpcGetMemHandle hipIpcGetMemHandle
#define cudaIpcOpenMemHandle hipIpcOpenMemHandle
#define cudaIpcCloseMemHandle hipIpcCloseMemHandle
#define cudaIpcMemLazyEnablePeerAccess hipIpcMemLazyEnablePeerAccess
#define cudaIpcEventHandle_t hipIpcEventHandle_t
#define cudaIpcGetEventHandle hipIpcGetEventHandle
#define cudaIpcOpenEventHandle hipIpcOpenEventHandle
#define cudaEventInterprocess hipEventInterprocess
#define cudaEventQuery hipEventQuery
#define cudaErrorNotReady hipErrorNotReady

namespace litellama {
// The device's 16-byte UUID (cudaDeviceProp::uuid in CUDA; ROCm's properties have none).
inline hipError_t gpu_device_uuid(int device, unsigned char (&uuid)[16]) {
  hipUUID id;
  const hipError_t err = hipDeviceGetUuid(&id, device);
  if (err == hipSuccess) {
    for (int i = 0; i < 16; ++i) uuid[i] = static_cast<unsigned char>(id.bytes[i]);
  }
  return err;
}
}  // namespace litellama

#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes(attr, kernel) \
  hipFuncGetAttributes((attr), reinterpret_cast<const void*>(kernel))

// ---- 16-bit floats ------------------------------------------------------------------------------
namespace litellama {
using gpu_bf16 = hip_bfloat16;
#if defined(__HIPCC__)  // for the host compiler, hip_bfloat16 is a plain struct of its bits
__host__ __device__ inline float gpu_bf16_to_float(gpu_bf16 x) {
  return static_cast<float>(x);
}
// hip_bfloat16's constructor rounds to nearest even, as __float2bfloat16_rn does.
__host__ __device__ inline gpu_bf16 gpu_float_to_bf16_rn(float x) {
  return gpu_bf16(x);
}
#endif
}  // namespace litellama

#else  // CUDA

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace litellama {
// The device's 16-byte UUID (cudaDeviceProp::uuid).
inline cudaError_t gpu_device_uuid(int device, unsigned char (&uuid)[16]) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err == cudaSuccess) {
    for (int i = 0; i < 16; ++i) uuid[i] = static_cast<unsigned char>(prop.uuid.bytes[i]);
  }
  return err;
}
using gpu_bf16 = __nv_bfloat16;
__host__ __device__ inline float gpu_bf16_to_float(gpu_bf16 x) {
  return __bfloat162float(x);
}
__host__ __device__ inline gpu_bf16 gpu_float_to_bf16_rn(float x) {
  return __float2bfloat16_rn(x);
}
}  // namespace litellama

#endif

// ---- warp functions (32-lane warps, see the top of this file)
// ------------------------------------
#if defined(__CUDACC__) || defined(__HIPCC__)
namespace litellama {

inline constexpr int kWarpLanes = 32;

// Value of lane (lane ^ off) of the calling lane's warp; every lane of the warp takes part.
template <typename T>
__device__ __forceinline__ T gpu_shfl_xor(T x, int off) {
#if LITELLAMA_HIP
  return __shfl_xor(x, off, kWarpLanes);
#else
  return __shfl_xor_sync(0xffffffffu, x, off);
#endif
}

// Value of lane (lane - delta) of the calling lane's warp (the lane's own below delta).
template <typename T>
__device__ __forceinline__ T gpu_shfl_up(T x, unsigned delta) {
#if LITELLAMA_HIP
  return __shfl_up(x, delta, kWarpLanes);
#else
  return __shfl_up_sync(0xffffffffu, x, delta);
#endif
}

// Bit l set when lane l of the calling lane's warp passes pred; every lane of the warp takes part.
__device__ __forceinline__ unsigned gpu_ballot(bool pred) {
#if LITELLAMA_HIP
  const unsigned long long wave = __ballot(pred);
  return static_cast<unsigned>(wave >> (__lane_id() & kWarpLanes));
#else
  return __ballot_sync(0xffffffffu, pred);
#endif
}

// Orders the shared-memory accesses of the warp's lanes before the call against those after it.
__device__ __forceinline__ void gpu_syncwarp() {
#if LITELLAMA_HIP
  // A wavefront runs its lanes in lockstep; the fences keep the compiler from moving shared
  // memory accesses across the point and make them visible to the other lanes.
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

}  // namespace litellama
#endif
