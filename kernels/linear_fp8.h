// Linear layers with FP8 (e4m3) weights, the compressed-tensors float-quantized checkpoints:
// y[m, n] = x[m, k] @ W^T with W[col, row] = e4m3(code[col, row]) * scale[col].
//
// Device layout: the checkpoint's codes as stored, [n, k] bytes row-major by output column, and
// one float32 scale per output column (a per-tensor scale is repeated into each column's; fused
// projections concatenate their modules' columns).
//
// Three paths behind launch_fp8_linear, chosen by fp8_linear_path:
//   - kGemv (CUDA builds, bf16/fp16, m <= kFp8GemvMaxRows, k a multiple of 128): a tensor-core GEMV
//     that streams the codes once, turns each pair into the compute dtype in registers (exact:
//     every e4m3 value is a bf16 and an fp16 value) and multiplies on mma.m16n8k16 with float32
//     sums; the column's scale multiplies the sum. Activations stay in the compute dtype: the
//     weight-only numerics of the CPU backend, which dequantizes the weights at load.
//   - kGemm (CUDA builds on compute capability 8.9 or later, bf16/fp16, larger steps): each
//     token's activations are quantized to e4m3 with a scale of its own (launch_fp8_quantize_rows:
//     the row's largest |x| / 448, codes rounded to nearest, ties to even) and one cuBLASLt FP8
//     GEMM multiplies them, D[t, c] = (sum_k qx[t, k] qw[c, k]) * sx[t] * scale[c], float32
//     accumulation, output in the compute dtype. The scales are cuBLASLt's outer-vector scaling
//     where the library has it for the shape; else the GEMM runs unscaled into y and a kernel
//     applies both scales in place. Activations are always quantized per token at run time, also
//     for checkpoints that store a static input_scale (docs/quantization.md says why).
//   - kDequantize (float32 models, portable builds, devices without FP8 tensor cores): W into a
//     dense [n, k] workspace of the compute dtype (each weight float(code) * scale, rounded once:
//     in float32 the CPU backend's values bit for bit) and the dense linear layer
//     (kernels/linear.h; with batch_invariant, its tiled kernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"
#include "kernels/linear.h"

namespace litellama {

inline constexpr int32_t kFp8GemvMaxRows = 16;
inline constexpr float kFp8E4m3Max = 448.0f;

struct Fp8Weight {
  const uint8_t* codes = nullptr;  // [n, k] e4m3
  const float* scales = nullptr;   // [n]
  int32_t n = 0;
  int32_t k = 0;
};

enum class Fp8Path { kGemv, kGemm, kDequantize };
const char* fp8_path_name(Fp8Path path);

// The cuBLASLt state of the kGemm path: the library handle and one matmul plan per shape (its
// descriptors and the heuristic's algorithm), made on first use. Not thread-safe: one per stream.
class Fp8Gemm {
 public:
  // kUnsupported where the build or the current device has no FP8 GEMM (fp8_gemm_available()).
  static Result<std::unique_ptr<Fp8Gemm>> create();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // y[m, n] (out_dtype, bf16 or fp16) = dequantized product of xq [m, k] (e4m3, per-row scales
  // x_scales [m]) and w; `workspace` is the library's scratch.
  Status run(void* y, const uint8_t* xq, const float* x_scales, const Fp8Weight& w, int32_t m,
             DType out_dtype, void* workspace, size_t workspace_bytes, KernelStream stream);
  // Whether any shape so far fell back to the unscaled GEMM and the scaling kernel.
  bool used_fallback() const;

  struct Impl;

 private:
  explicit Fp8Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether this build and the current device run the kGemm path (CUDA, not portable kernels,
// compute capability 8.9+).
bool fp8_gemm_available();

// The path launch_fp8_linear takes for m rows (gemm_available: an Fp8Gemm exists).
Fp8Path fp8_linear_path(DType dtype, int32_t m, int32_t k, bool gemm_available);

// What launch_fp8_linear needs besides its operands; members a path does not use may be null.
struct Fp8Scratch {
  uint8_t* xq = nullptr;      // [m, k] e4m3 (kGemm)
  float* x_scales = nullptr;  // [m] (kGemm)
  // kGemm: xq and x_scales already hold x quantized (by the kernel that produced x:
  // launch_add_rmsnorm_fp8, launch_silu_mul_fp8), so the quantizer does not run.
  bool x_quantized = false;
  void* dense = nullptr;    // [n, k] of the compute dtype (kDequantize)
  Fp8Gemm* gemm = nullptr;  // kGemm
  void* gemm_workspace = nullptr;
  size_t gemm_workspace_bytes = 0;
};

// W as dense [n, k] of dtype (f32, bf16 or fp16) into `dense`.
Status launch_fp8_dequantize(void* dense, const Fp8Weight& w, DType dtype, KernelStream stream);

// Per-row quantization of x [m, k] (dtype bf16 or fp16; k a multiple of 8): scales[r] = max |x[r]|
// / 448 (1 for a row of zeros), q[r, i] = e4m3(x[r, i] / scales[r]) rounded to nearest, ties to
// even, saturated at +-448. CUDA builds only (kUnsupported in portable builds).
Status launch_fp8_quantize_rows(uint8_t* q, float* scales, const void* x, int32_t m, int32_t k,
                                DType dtype, KernelStream stream);

// y[m, n] (dtype) = x[m, k] (dtype) @ W^T by fp8_linear_path(dtype, m, w.k, scratch.gemm).
Status launch_fp8_linear(void* y, const void* x, const Fp8Weight& w, int32_t m, DType dtype,
                         const Fp8Scratch& scratch, bool batch_invariant, LinearHandle handle,
                         KernelStream stream);

}  // namespace litellama
