// Linear layers with 4-bit weights and 16- or 32-bit activations (W4A16: AWQ and GPTQ
// checkpoints): y[m, n] = x[m, k] @ W^T with W[col, row] = (code - zero) * scale, the code 4 bits,
// zero point and scale per group of `group` consecutive input rows of an output column.
//
// Device layout (written by pack_w4_codes at load; not a checkpoint's): codes [n, k / 8] 32-bit
// words, row-major by output column; word w of column c holds the codes of input rows 8w .. 8w+7
// with row 8w + 2i in bits 4i .. 4i+3 and row 8w + 2i + 1 in bits 4(i+4) .. 4(i+4)+3 (i < 4).
// Masking a word shifted right by 4i with 0x000f000f leaves the codes of two consecutive rows in
// the two 16-bit halves, which an OR with the bits of 128.0 (bf16) or 1024.0 (fp16) turns into
// 128 + code or 1024 + code exactly: the small-batch kernel dequantizes two weights per
// instruction that way. Zero points are bytes [n, k / group]; scales [n, k / group] in the
// compute dtype (the checkpoint's fp16 scales are rounded once to bf16 for a bf16 model).
//
// Two kernels behind launch_w4_linear:
//   - dequantize (every build; the only path of portable builds, LITELLAMA_PORTABLE_KERNELS and
//     HIP): W into a dense [n, k] workspace of the compute dtype, each weight float(code - zero) *
//     float(scale) rounded once, then the dense linear layer (kernels/linear.h; with
//     `batch_invariant`, its tiled kernel). In float32 the weights are exactly the CPU backend's,
//     which dequantizes the same way at load.
//   - small batches (CUDA, bf16/fp16, m <= kW4GemvMaxRows, k a multiple of 128, groups of a power
//     of two of at least 32 rows or one group of all k): a tensor-core GEMV that streams the 4-bit
//     codes once, dequantizes them in registers to the values the workspace would hold (code - zero
//     is exact in 16 bits, the product by the scale rounded once), and multiplies on mma.m16n8k16
//     with float32 sums.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"
#include "kernels/linear.h"

namespace litellama {

inline constexpr int32_t kW4GemvMaxRows = 16;

// A quantized weight on the device, in the layout above.
struct W4Weight {
  const uint32_t* codes = nullptr;  // [n, k / 8]
  const uint8_t* zeros = nullptr;   // [n, k / group]
  const void* scales = nullptr;     // [n, k / group] of the compute dtype
  int32_t n = 0;
  int32_t k = 0;
  int32_t group = 0;
};

// Host side: codes [n, k] (values 0..15, row-major by output column) into the device layout's
// n * k / 8 words. k must be a multiple of 8.
void pack_w4_codes(const uint8_t* codes, int64_t n, int64_t k, uint32_t* words);

// Shapes the layout holds: k a multiple of 8, group a multiple of 8 that divides k.
bool w4_layout_supports(int64_t n, int64_t k, int64_t group);

// Whether launch_w4_linear runs m rows through the small-batch kernel in this build.
bool w4_gemv_supports(DType dtype, int32_t m, int32_t k, int32_t group);

// W as dense [n, k] of dtype (f32, bf16 or fp16) into `dense`.
Status launch_w4_dequantize(void* dense, const W4Weight& w, DType dtype, KernelStream stream);

// y[m, n] (dtype) = x[m, k] (dtype) @ W^T: the small-batch kernel where w4_gemv_supports, else
// launch_w4_dequantize into `workspace` (n * k elements of dtype) and the dense linear layer
// through `handle` (the tiled kernel when batch_invariant).
Status launch_w4_linear(void* y, const void* x, const W4Weight& w, int32_t m, DType dtype,
                        void* workspace, bool batch_invariant, LinearHandle handle,
                        KernelStream stream);

}  // namespace litellama
