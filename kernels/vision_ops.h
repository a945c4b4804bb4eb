// The operations of a CLIP vision tower and LLaVA's projector that the text model's kernels do not
// cover (services/vision/cuda/cuda_vision_encoder.h runs them between cuBLAS GEMMs):
//   - LayerNorm with weight and bias (CLIP's pre_layrnorm, layer_norm1/2): float32 statistics,
//     biased variance as torch's;
//   - bias + activation (+ residual) after a GEMM without bias: quick_gelu (x sigmoid(1.702 x)),
//     exact GELU (erf), or none;
//   - the class and position embeddings around the patch convolution's output;
//   - dense (non-causal) multi-head attention over one image's tokens: scores and the weighted
//     sum as strided-batched cuBLAS GEMMs over the heads where cuBLAS exists, a plain kernel in
//     portable builds; the softmax in float32.
// Every activation is stored in `dtype` (float32, bf16 or fp16) and computed in float32, one
// rounding per stored value, as torch computes the same ops in that dtype; the small parameters
// (norm weights, biases, class and position embeddings) are float32.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"
#include "kernels/linear.h"

namespace litellama {

bool vision_ops_supports(DType dtype);

// out[r] = (in[r] - mean) / sqrt(var + eps) * weight + bias per row of `dim`; out may be in.
Status launch_layer_norm(void* out, const void* in, const float* weight, const float* bias,
                         int32_t n_rows, int32_t dim, float eps, DType dtype, KernelStream stream);

// The residual add after an attention or MLP block fused with the LayerNorm that follows it:
// x[r] = x[r] + (delta[r] + bias) (each sum rounded to dtype, as launch_bias_act with a residual)
// and then normed[r] = layer_norm(x[r]) (as launch_layer_norm over the stored x). normed may be
// delta; x may not alias either.
Status launch_bias_residual_layer_norm(void* x, const void* delta, const float* bias, void* normed,
                                       const float* weight, const float* norm_bias, int32_t n_rows,
                                       int32_t dim, float eps, DType dtype, KernelStream stream);

enum class VisionActivation { kNone, kQuickGelu, kGeluErf };

// out[r, c] = act(x[r, c] + bias[c]) + (residual ? residual[r, c] : 0), each term rounded to
// dtype as torch rounds the separate ops (the sum with bias, the activation, the residual add).
// bias may be null (no bias); out may be x or residual.
Status launch_bias_act(void* out, const void* x, const float* bias, const void* residual,
                       int32_t n_rows, int32_t cols, VisionActivation act, DType dtype,
                       KernelStream stream);

// CLIP's embeddings: x is [n_positions, hidden] whose rows 1.. hold the patch convolution's
// output; row 0 becomes class_embedding, then every row adds its position embedding.
Status launch_add_class_position(void* x, const float* class_embedding,
                                 const float* position_embedding, int32_t n_positions,
                                 int32_t hidden, DType dtype, KernelStream stream);

// Workspace launch_dense_attention needs: float scores and dtype probabilities of every head.
size_t dense_attention_workspace_bytes(int32_t n_tokens, int32_t n_heads, DType dtype);

// out[t, h*hd .. ] = softmax(q_h[t] k_h^T / sqrt(hd)) v_h over all n_tokens keys (no mask), for
// qkv rows [q | k | v], each n_heads * head_dim wide. `workspace` of at least
// dense_attention_workspace_bytes, 256-byte aligned.
Status launch_dense_attention(void* out, const void* qkv, void* workspace, int32_t n_tokens,
                              int32_t n_heads, int32_t head_dim, DType dtype, LinearHandle handle,
                              KernelStream stream);

}  // namespace litellama
