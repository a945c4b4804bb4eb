// FP8 linear layers (see linear_fp8.h): the dequantizing kernel of every build, and in CUDA builds
// the small-batch GEMV, the per-token activation quantizer and the cuBLASLt FP8 GEMM.
#include "kernels/linear_fp8.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

#define LITELLAMA_FP8_GEMM (!LITELLAMA_PORTABLE_KERNELS && LITELLAMA_HAVE_CUBLAS)

#if !LITELLAMA_PORTABLE_KERNELS
#include <cuda_fp8.h>

#include "kernels/fp8_common.cuh"
#include "kernels/linear_fp8_impl.cuh"
#endif
#if LITELLAMA_FP8_GEMM
#include <cublasLt.h>
#endif

namespace litellama {
namespace {

// e4m3 (bias 7, no infinities) to float, exactly: normal codes are 2^(e-7) * (1 + m/8), whose
// float32 exponent field is e + 120; subnormal codes are m * 2^-9. Code 0x7f / 0xff (NaN) never
// occurs in a checkpoint the loader accepts as finite weights.
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  const float mag =
      e == 0 ? static_cast<float>(m) * 0x1p-9f : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (b & 0x80u) != 0 ? -mag : mag;
}

// One thread per 8 codes of a column, stored as one vector.
template <typename T>
__global__ void fp8_dequantize_kernel(T* __restrict__ dense, const uint8_t* __restrict__ codes,
                                      const float* __restrict__ scales, int64_t n_vecs,
                                      int32_t vecs_per_col) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float scale = scales[i / vecs_per_col];
    const uint2 c = reinterpret_cast<const uint2*>(codes)[i];
    Vec<T, 8> out;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out.v[j] = from_float<T>(e4m3_to_float((c.x >> (8 * j)) & 0xffu) * scale);
      out.v[4 + j] = from_float<T>(e4m3_to_float((c.y >> (8 * j)) & 0xffu) * scale);
    }
    store_vec<T, 8>(dense + i * 8, out);
  }
}

#if !LITELLAMA_PORTABLE_KERNELS

// One block per row (kernels/fp8_common.cuh).
template <typename T>
__global__ void __launch_bounds__(1024)
    fp8_quantize_rows_kernel(uint8_t* __restrict__ q, float* __restrict__ scales,
                             const T* __restrict__ x, int32_t k) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float scratch[32];
  const T* row = x + static_cast<int64_t>(blockIdx.x) * k;
  quantize_row_e4m3(q + static_cast<int64_t>(blockIdx.x) * k, scales + blockIdx.x, k, scratch,
                    [&](int i, float(&v)[8]) {
                      const Vec<T, 8> r = load_vec<T, 8>(row + i);
#pragma unroll
                      for (int j = 0; j < 8; ++j) v[j] = to_float(r.v[j]);
                    });
}

// y[t, c] = y[t, c] * row_scales[t] * col_scales[c], in place (the unscaled GEMM's fallback).
template <typename T>
__global__ void fp8_scale_kernel(T* __restrict__ y, const float* __restrict__ row_scales,
                                 const float* __restrict__ col_scales, int32_t m, int32_t n) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t total = static_cast<int64_t>(m) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = from_float<T>(to_float(y[i]) * row_scales[i / n] * col_scales[i % n]);
  }
}

// The small-batch GEMV's configuration (litellama-linear-bench --fp8 on the H200, bench/
// RESULTS.md).
template <typename T>
Status launch_gemv_typed(void* y, const void* x, const Fp8Weight& w, int32_t m,
                         KernelStream stream) {
  using fp8_detail::launch_gemv;
  const bool narrow = w.n <= 4096;
  cudaError_t e;
  if (m <= 8) {
    e = narrow ? launch_gemv<T, 16, 1, 1, 1>(y, x, w, m, stream)
               : launch_gemv<T, 8, 2, 1, 1>(y, x, w, m, stream);
  } else {
    e = narrow ? launch_gemv<T, 16, 1, 1, 2>(y, x, w, m, stream)
               : launch_gemv<T, 8, 1, 1, 2>(y, x, w, m, stream);
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(e);
  return Status::ok();
}

#endif  // !LITELLAMA_PORTABLE_KERNELS

}  // namespace

const char* fp8_path_name(Fp8Path path) {
  switch (path) {
    case Fp8Path::kGemv:
      return "FP8 GEMV";
    case Fp8Path::kGemm:
      return "cuBLASLt FP8 GEMM (activations e4m3 per token)";
    case Fp8Path::kDequantize:
      return "FP8 dequantize -> GEMM";
  }
  return "?";
}

#if LITELLAMA_FP8_GEMM

// One plan per (m, n, k, output dtype): cuBLASLt's column-major view of y^T [n, m] = W [n, k]
// (stored [n, k] row-major: A, k x n, transposed) times xq^T (B, k x m, as stored). The operands
// are e4m3, the sums float32, D in the compute dtype. A's scale vector has one float per row of
// D (the weight's columns), B's one per column of D (the tokens).
struct Fp8Gemm::Impl {
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool outer = false;  // outer-vector scales; else unscaled and fp8_scale_kernel
  };
  cublasLtHandle_t lt = nullptr;
  std::map<std::tuple<int32_t, int32_t, int32_t, DType>, Plan> plans;
  bool fallback = false;

  ~Impl() {
    for (auto& [key, p] : plans) {
      (void)cublasLtMatrixLayoutDestroy(p.a);
      (void)cublasLtMatrixLayoutDestroy(p.b);
      (void)cublasLtMatrixLayoutDestroy(p.d);
      (void)cublasLtMatmulDescDestroy(p.desc);
    }
    if (lt != nullptr) (void)cublasLtDestroy(lt);
  }

  // The heuristic's best algorithm for the plan as its descriptor now stands; false when none.
  bool find_algo(Plan& p, size_t workspace_bytes) const {
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    const uint64_t bytes = workspace_bytes;
    (void)cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &bytes, sizeof(bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p.algo = result.algo;
    return true;
  }

  Result<Plan*> plan(int32_t m, int32_t n, int32_t k, DType out, const float* a_scales,
                     const float* b_scales, size_t workspace_bytes) {
    const auto key = std::make_tuple(m, n, k, out);
    auto it = plans.find(key);
    if (it != plans.end()) return &it->second;
    Plan p;
    const cudaDataType_t d_type = out == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, k, n, k));
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, k, m, k));
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.d, d_type, n, m, n));
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    bool ok =
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer,
                                       sizeof(outer)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer,
                                       sizeof(outer)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales,
                                       sizeof(a_scales)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales,
                                       sizeof(b_scales)) == CUBLAS_STATUS_SUCCESS;
    p.outer = ok && find_algo(p, workspace_bytes);
    if (!p.outer) {
      // Unscaled: scalar mode with no scale pointers (scale 1); the scales follow in place.
      const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      const float* none = nullptr;
      LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &scalar, sizeof(scalar)));
      LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &scalar, sizeof(scalar)));
      LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &none, sizeof(none)));
      LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &none, sizeof(none)));
      if (!find_algo(p, workspace_bytes)) {
        (void)cublasLtMatrixLayoutDestroy(p.a);
        (void)cublasLtMatrixLayoutDestroy(p.b);
        (void)cublasLtMatrixLayoutDestroy(p.d);
        (void)cublasLtMatmulDescDestroy(p.desc);
        return make_error(StatusCode::kUnsupported, "cuBLASLt has no FP8 GEMM for m {} n {} k {}",
                          m, n, k);
      }
      fallback = true;
    }
    return &plans.emplace(key, p).first->second;
  }
};

Fp8Gemm::Fp8Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Fp8Gemm::~Fp8Gemm() = default;

Result<std::unique_ptr<Fp8Gemm>> Fp8Gemm::create() {
  if (!fp8_gemm_available()) {
    return make_error(StatusCode::kUnsupported,
                      "the FP8 GEMM needs a CUDA device of compute capability 8.9 or later");
  }
  auto impl = std::make_unique<Impl>();
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->lt));
  return std::unique_ptr<Fp8Gemm>(new Fp8Gemm(std::move(impl)));
}

bool Fp8Gemm::used_fallback() const {
  return impl_->fallback;
}

Status Fp8Gemm::run(void* y, const uint8_t* xq, const float* x_scales, const Fp8Weight& w,
                    int32_t m, DType out_dtype, void* workspace, size_t workspace_bytes,
                    KernelStream stream) {
  if (out_dtype != DType::kBF16 && out_dtype != DType::kF16) {
    return make_error(StatusCode::kUnsupported, "FP8 GEMM: output dtype {}",
                      dtype_torch_name(out_dtype));
  }
  LITELLAMA_ASSIGN_OR_RETURN(
      Impl::Plan * p, impl_->plan(m, w.n, w.k, out_dtype, w.scales, x_scales, workspace_bytes));
  if (p->outer) {
    // The descriptor is shared by every weight of this shape: its scale pointers are this call's.
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w.scales, sizeof(w.scales)));
    LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  LITELLAMA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(impl_->lt, p->desc, &alpha, w.codes, p->a, xq,
                                                  p->b, &beta, y, p->d, y, p->d, &p->algo,
                                                  workspace, workspace_bytes, stream.stream));
  if (p->outer) return Status::ok();
  return dispatch_float_dtype(out_dtype, "fp8 scale", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int64_t total = static_cast<int64_t>(m) * w.n;
    const auto blocks =
        static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(total, 256), 4096));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(fp8_scale_kernel<T>, dim3(blocks), dim3(256), 0,
                                                 stream, static_cast<T*>(y), x_scales, w.scales, m,
                                                 w.n));
    return Status::ok();
  });
}

bool fp8_gemm_available() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major * 10 + minor >= 89;
}

#else  // !LITELLAMA_FP8_GEMM

struct Fp8Gemm::Impl {};
Fp8Gemm::Fp8Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Fp8Gemm::~Fp8Gemm() = default;
Result<std::unique_ptr<Fp8Gemm>> Fp8Gemm::create() {
  return make_error(StatusCode::kUnsupported, "this build has no FP8 GEMM (portable kernels)");
}
bool Fp8Gemm::used_fallback() const {
  return false;
}
Status Fp8Gemm::run(void*, const uint8_t*, const float*, const Fp8Weight&, int32_t, DType, void*,
                    size_t, KernelStream) {
  return make_error(StatusCode::kUnsupported, "this build has no FP8 GEMM (portable kernels)");
}
bool fp8_gemm_available() {
  return false;
}

#endif  // LITELLAMA_FP8_GEMM

Fp8Path fp8_linear_path(DType dtype, int32_t m, int32_t k, bool gemm_available) {
  const bool half = dtype == DType::kBF16 || dtype == DType::kF16;
#if !LITELLAMA_PORTABLE_KERNELS
  if (half && m <= kFp8GemvMaxRows && k % 128 == 0) return Fp8Path::kGemv;
#endif
  if (half && gemm_available && k % 16 == 0) return Fp8Path::kGemm;
  return Fp8Path::kDequantize;
}

Status launch_fp8_dequantize(void* dense, const Fp8Weight& w, DType dtype, KernelStream stream) {
  if (w.n <= 0 || w.k <= 0 || w.k % 8 != 0) {
    return make_error(StatusCode::kInvalidArgument, "fp8 dequantize: n {} k {}", w.n, w.k);
  }
  return dispatch_float_dtype(dtype, "fp8 dequantize", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int64_t n_vecs = static_cast<int64_t>(w.n) * (w.k / 8);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(n_vecs, threads), 65536);
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(fp8_dequantize_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                      0, stream, static_cast<T*>(dense), w.codes, w.scales, n_vecs, w.k / 8));
    return Status::ok();
  });
}

Status launch_fp8_quantize_rows(uint8_t* q, float* scales, const void* x, int32_t m, int32_t k,
                                DType dtype, KernelStream stream) {
  if (m == 0) return Status::ok();
  if (k <= 0 || k % 8 != 0 || (dtype != DType::kBF16 && dtype != DType::kF16)) {
    return make_error(StatusCode::kInvalidArgument, "fp8 quantize rows: k {} dtype {}", k,
                      dtype_torch_name(dtype));
  }
#if LITELLAMA_PORTABLE_KERNELS
  (void)q, (void)scales, (void)x, (void)stream;
  return make_error(StatusCode::kUnsupported, "fp8 quantize rows: not in portable builds");
#else
  return dispatch_float_dtype(dtype, "fp8 quantize rows", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
        fp8_quantize_rows_kernel<T>, dim3(static_cast<unsigned>(m)), dim3(quantize_row_threads(k)),
        0, stream, q, scales, static_cast<const T*>(x), k));
    return Status::ok();
  });
#endif
}

Status launch_fp8_linear(void* y, const void* x, const Fp8Weight& w, int32_t m, DType dtype,
                         const Fp8Scratch& scratch, bool batch_invariant, LinearHandle handle,
                         KernelStream stream) {
  if (m == 0) return Status::ok();
  switch (fp8_linear_path(dtype, m, w.k, scratch.gemm != nullptr)) {
    case Fp8Path::kGemv:
#if !LITELLAMA_PORTABLE_KERNELS
      if (dtype == DType::kBF16) return launch_gemv_typed<__nv_bfloat16>(y, x, w, m, stream);
      return launch_gemv_typed<__half>(y, x, w, m, stream);
#else
      break;
#endif
    case Fp8Path::kGemm:
      if (!scratch.x_quantized) {
        LITELLAMA_RETURN_IF_ERROR(
            launch_fp8_quantize_rows(scratch.xq, scratch.x_scales, x, m, w.k, dtype, stream));
      }
      return scratch.gemm->run(y, scratch.xq, scratch.x_scales, w, m, dtype, scratch.gemm_workspace,
                               scratch.gemm_workspace_bytes, stream);
    case Fp8Path::kDequantize:
      break;
  }
  if (scratch.dense == nullptr) {
    return make_error(StatusCode::kInternal, "fp8 linear: no dequantization workspace");
  }
  LITELLAMA_RETURN_IF_ERROR(launch_fp8_dequantize(scratch.dense, w, dtype, stream));
  if (batch_invariant) {
    return launch_linear_tiled(y, x, scratch.dense, m, w.n, w.k, dtype, dtype, stream);
  }
  return launch_linear(y, x, scratch.dense, m, w.n, w.k, dtype, dtype, handle, stream);
}

}  // namespace litellama
