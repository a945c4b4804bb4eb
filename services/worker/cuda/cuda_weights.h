// The model's weights on the device, converted once on the host from the checkpoint's storage
// dtype to the compute dtype and uploaded into one allocation. Matrices are in the compute dtype,
// row-major [out_features, in_features] as in the checkpoint; q/k/v and gate/up are concatenated
// along out_features so each pair or triple is one GEMM. Norm weights and biases are float32 (the
// kernels add and scale in float32).
//
// With fold_input_norms, each layer's input RMSNorm weight g is multiplied into the columns of
// its q/k/v projection, each product rounded once to the compute dtype, and the norm's weight
// becomes ones: (rmsnorm(x) * g) @ W^T = rmsnorm(x) @ (W diag(g))^T. The norm kernel then
// computes what it did (times ones), and the small-batch QKV GEMV can take the whole norm in
// (kernels/gemv.h, GemvRmsNorm), since no per-column weight is left to apply to its input.
//
// 4-bit checkpoints (AWQ, GPTQ 4-bit without act-order): each fused projection whose modules are
// all stored quantized stays 4-bit on the device, in kernels/linear_w4.h's layout (its codes,
// zero points and scales concatenated along out_features like the dense matrices), and its dense
// pointer is null. FP8 checkpoints likewise keep each fully quantized fused projection 8-bit, in
// kernels/linear_fp8.h's layout (the codes as stored, one float32 scale per output column). Input
// norms are never folded into quantized projections.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/linear_fp8.h"
#include "kernels/linear_w4.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cuda/device_buffer.h"

namespace litellama {

struct CudaLayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  const void* qkv = nullptr;          // [(n_heads + 2 n_kv_heads) * head_dim, hidden]
  const float* qkv_bias = nullptr;    // [(n_heads + 2 n_kv_heads) * head_dim] or nullptr
  const float* q_norm = nullptr;      // [head_dim] or nullptr
  const float* k_norm = nullptr;      // [head_dim] or nullptr
  const void* o = nullptr;            // [hidden, n_heads * head_dim]
  const float* post_norm = nullptr;   // [hidden]
  const void* gate_up = nullptr;      // [2 * intermediate, hidden]
  const void* down = nullptr;         // [hidden, intermediate]
  // The same projections kept 4-bit or FP8 (the dense pointer above is then null); n == 0: not
  // in that format.
  W4Weight qkv_w4, o_w4, gate_up_w4, down_w4;
  Fp8Weight qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
};

struct CudaWeights {
  DeviceBuffer storage;
  std::vector<CudaLayerWeights> layers;
  const void* embed = nullptr;        // [vocab, hidden]
  const void* lm_head = nullptr;      // [vocab, hidden] (== embed when tied)
  const float* final_norm = nullptr;  // [hidden]
  bool input_norms_folded = false;    // layers' input_norm are ones, folded into qkv
  // Elements of the largest 4-bit projection (n * k; 0 when none): the dequantizing path's
  // workspace holds that many of the compute dtype.
  int64_t max_w4_elements = 0;
  int32_t w4_group = 0;  // input rows per group of the 4-bit projections (0: none)
  // Elements of the largest FP8 projection (0 when none): the size of the dequantizing path's
  // workspace.
  int64_t max_fp8_elements = 0;

  // Converts and uploads every weight of `checkpoint` (synchronously, at load time).
  static Result<CudaWeights> upload(const Checkpoint& checkpoint, DType compute_dtype,
                                    bool fold_input_norms = false);
};

}  // namespace litellama
