// The GEMV variants of portable builds (gemv.h; LITELLAMA_PORTABLE_KERNELS, every HIP build):
// plain SIMT code with no inline PTX, for the shapes and epilogues of the tensor-core kernel
// (gemv_impl.cuh), behind the same launchers (gemv.cu). Included by gemv.cu only.
//
// A unit is two weight rows, one per warp (kWarpLanes lanes: a 64-lane wavefront runs two units):
//   kStore / kResidualAdd  rows 2u and 2u + 1 (the second may be past n and is then not stored);
//   kSiluMul               gate row u and up row inter + u of [w_gate; w_up];
//   kRope                  element j of the first half of head h and element half + j (u = h *
//                          half + j), the rotary pair qkv_rope rotates together.
// Lane l reads 16-byte vectors of both rows at k = 8 l, 8 l + 256, ... (a warp reads 512
// contiguous bytes of each row per step), with the same vectors of every token's x row (x is small
// and read by every warp, so it stays in cache), and accumulates in float32. The warp's sums meet
// in a butterfly (kernel_common.cuh's warp_allreduce), after which lane t < m finishes token t
// through gemv_epilogue.cuh, the epilogue the tensor-core kernel also uses. With kNorm the lanes
// also sum the squares of the x they read, and the sums are scaled by the row's 1 / rms.
//
// Written for correctness and a plain weight stream, not tuned: it runs in the GPU suite of the
// portable CUDA build on the H200 against the same references as the tensor-core kernel, and its
// speed on AMD GPUs is unmeasured.
#pragma once

#include <cstdint>

#include "kernels/gemv.h"
#include "kernels/gemv_epilogue.cuh"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama::gemv_portable {

enum class Epilogue { kStore, kResidualAdd, kSiluMul, kRope };

struct Params {
  const void* x;
  const void* w;
  void* y;
  int32_t m;
  int32_t n;  // rows of w
  int32_t k;
  int32_t ldy;     // elements between rows of y
  GemvRope rope;   // kRope
  float norm_eps;  // kNorm (GemvRmsNorm)
};

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpLanes;
constexpr int kVecElems = 8;  // 16 bytes of a 16-bit type

// Units (one per warp) of a shape.
template <Epilogue E>
__host__ __device__ __forceinline__ int64_t n_units(const Params& p) {
  if constexpr (E == Epilogue::kStore || E == Epilogue::kResidualAdd) {
    return (static_cast<int64_t>(p.n) + 1) / 2;
  } else {  // kSiluMul: n / 2 gate rows; kRope: n / 2 rotary pairs
    return p.n / 2;
  }
}

// The unit's two weight rows.
template <Epilogue E>
__device__ __forceinline__ void unit_rows(const Params& p, int64_t unit, int64_t& r0, int64_t& r1) {
  if constexpr (E == Epilogue::kStore || E == Epilogue::kResidualAdd) {
    r0 = 2 * unit;
    r1 = r0 + 1 < p.n ? r0 + 1 : r0;  // a lone last row reads itself twice and stores once
  } else if constexpr (E == Epilogue::kSiluMul) {
    r0 = unit;
    r1 = unit + p.n / 2;
  } else {
    const int half = p.rope.head_dim / 2;
    const int64_t head = unit / half;
    r0 = head * p.rope.head_dim + unit % half;
    r1 = r0 + half;
  }
}

// kM: rows of x the kernel is compiled for (m rounded up to 1, 2, 4 or 8); rows t >= m read
// nothing.
template <typename T, typename OutT, Epilogue E, int kM, bool kNorm>
__global__ void __launch_bounds__(kThreads) gemv_portable_kernel(Params p) {
  pdl_wait();
  const int lane = static_cast<int>(threadIdx.x) % kWarpLanes;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpLanes;
  if (unit >= n_units<E>(p)) return;
  int64_t r0, r1;
  unit_rows<E>(p, unit, r0, r1);
  const T* __restrict__ w0 = static_cast<const T*>(p.w) + r0 * p.k;
  const T* __restrict__ w1 = static_cast<const T*>(p.w) + r1 * p.k;
  const T* __restrict__ x = static_cast<const T*>(p.x);

  float acc0[kM] = {}, acc1[kM] = {}, squares[kM] = {};
#pragma unroll 4
  for (int64_t k0 = static_cast<int64_t>(lane) * kVecElems; k0 < p.k;
       k0 += kWarpLanes * kVecElems) {
    const Vec<T, kVecElems> a = load_vec<T, kVecElems>(w0 + k0);
    const Vec<T, kVecElems> b = load_vec<T, kVecElems>(w1 + k0);
#pragma unroll
    for (int t = 0; t < kM; ++t) {
      if (t < p.m) {
        const Vec<T, kVecElems> xv = load_vec<T, kVecElems>(x + t * static_cast<int64_t>(p.k) + k0);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) {
          const float xf = to_float(xv.v[e]);
          acc0[t] = fmaf(to_float(a.v[e]), xf, acc0[t]);
          acc1[t] = fmaf(to_float(b.v[e]), xf, acc1[t]);
          if constexpr (kNorm) squares[t] = fmaf(xf, xf, squares[t]);
        }
      }
    }
  }

  // Every lane gets every sum; lane t keeps token t's (selected without indexing by lane, which
  // would put the arrays in local memory).
  float s0 = 0.0f, s1 = 0.0f, sq = 0.0f;
#pragma unroll
  for (int t = 0; t < kM; ++t) {
    const float a = warp_allreduce(acc0[t], SumOp{});
    const float b = warp_allreduce(acc1[t], SumOp{});
    float c = 0.0f;
    if constexpr (kNorm) c = warp_allreduce(squares[t], SumOp{});
    if (lane == t) {
      s0 = a;
      s1 = b;
      sq = c;
    }
  }
  const int token = lane;
  if (token >= p.m) return;
  if constexpr (kNorm) {
    const float scale = gemv_epilogue::inv_rms(sq, p.k, p.norm_eps);
    s0 *= scale;
    s1 *= scale;
  }
  OutT* y = static_cast<OutT*>(p.y) + static_cast<int64_t>(token) * p.ldy;
  if constexpr (E == Epilogue::kStore) {
    y[r0] = from_float<OutT>(s0);
    if (r1 != r0) y[r1] = from_float<OutT>(s1);
  } else if constexpr (E == Epilogue::kResidualAdd) {
    gemv_epilogue::residual_add(&y[r0], s0);
    if (r1 != r0) gemv_epilogue::residual_add(&y[r1], s1);
  } else if constexpr (E == Epilogue::kSiluMul) {
    y[unit] = gemv_epilogue::silu_mul<T>(s0, s1);
  } else {
    const int half = p.rope.head_dim / 2;
    gemv_epilogue::rope_store<T>(p.rope, static_cast<int>(unit / half),
                                 static_cast<int>(unit % half), token, s0, s1);
  }
}

template <typename T, typename OutT, Epilogue E, int kM, bool kNorm>
cudaError_t launch_m(const Params& p, KernelStream stream) {
  const int64_t blocks = ceil_div<int64_t>(n_units<E>(p), kWarps);
  return launch_kernel(gemv_portable_kernel<T, OutT, E, kM, kNorm>,
                       dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, p);
}

// The launch for p.m rows (1 <= m <= kGemvMaxRows; the caller checked the shape).
template <typename T, typename OutT, Epilogue E, bool kNorm = false>
cudaError_t launch(const Params& p, KernelStream stream) {
  static_assert(kGemvMaxRows == 8, "kM covers 1, 2, 4 and 8 rows");
  if (p.m <= 1) return launch_m<T, OutT, E, 1, kNorm>(p, stream);
  if (p.m <= 2) return launch_m<T, OutT, E, 2, kNorm>(p, stream);
  if (p.m <= 4) return launch_m<T, OutT, E, 4, kNorm>(p, stream);
  return launch_m<T, OutT, E, 8, kNorm>(p, stream);
}

}  // namespace litellama::gemv_portable
