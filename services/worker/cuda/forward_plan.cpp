// plan_forward: see forward_plan.h.
#include "services/worker/cuda/forward_plan.h"

#include <fmt/format.h>

#include "kernels/attention_decode.h"
#include "kernels/gemv.h"
#include "kernels/linear_w4.h"
#include "kernels/sampling.h"

namespace litellama {

namespace {

const char* qkv_path_name(QkvPath p) {
  switch (p) {
    case QkvPath::kLinearThenRope:
      return "add_rmsnorm -> linear -> qkv_rope";
    case QkvPath::kNormThenGemvRope:
      return "add_rmsnorm -> gemv_qkv_rope";
    case QkvPath::kFoldedNormGemvRope:
      return "gemv_qkv_rope with the input norm folded in";
  }
  return "?";
}

const char* via(bool gemv, bool w4) {
  if (w4) return gemv ? "W4 GEMV" : "W4 dequantize -> GEMM";
  return gemv ? "GEMV" : "cuBLAS";
}

}  // namespace

ForwardPlan plan_forward(const StepPlan& step, int32_t n_top, const ForwardPlanContext& ctx) {
  const ModelConfig& c = *ctx.config;
  const RunnerOptions& o = *ctx.options;
  const DType dt = ctx.dtype;
  const int32_t T = step.n_tokens;
  const int32_t q_dim = c.n_heads * c.head_dim;
  ForwardPlan p;
  auto gemv_takes = [&](int32_t rows, int32_t k) {
    return rows <= o.gemv_max_tokens && gemv_supports(dt, dt, rows, k);
  };
  p.w4 = ctx.w4_group > 0;
  p.fp8 = ctx.fp8;
  p.gemv_layers = !p.w4 && !p.fp8 && gemv_takes(T, c.hidden_size) && gemv_takes(T, q_dim) &&
                  gemv_takes(T, c.intermediate_size);
  if (p.w4) {
    // launch_w4_linear's choice, per projection (its k).
    auto w4_takes = [&](int32_t k) { return w4_gemv_supports(dt, T, k, ctx.w4_group); };
    p.qkv_gemv = p.gate_up_linear_gemv = w4_takes(c.hidden_size);
    p.o_gemv = w4_takes(q_dim);
    p.down_gemv = w4_takes(c.intermediate_size);
  } else if (p.fp8) {
    // launch_fp8_linear's choice, per projection (its k).
    const int32_t ks[4] = {c.hidden_size, q_dim, c.hidden_size, c.intermediate_size};
    for (int i = 0; i < 4; ++i) {
      p.fp8_paths[i] = fp8_linear_path(dt, T, ks[i], ctx.fp8_gemm);
      p.fp8_fused_inputs[i] = i != 1 && p.fp8_paths[i] == Fp8Path::kGemm;
    }
  } else if (p.gemv_layers) {
    const bool rope_gemv = !c.qk_norm && gemv_rope_supports(c.head_dim);
    p.qkv = !rope_gemv               ? QkvPath::kLinearThenRope
            : ctx.input_norms_folded ? QkvPath::kFoldedNormGemvRope
                                     : QkvPath::kNormThenGemvRope;
    p.qkv_gemv = p.o_gemv = p.down_gemv = true;
    p.gate_up_gemv = T <= o.gemv_gate_up_max_tokens;
  } else {
    p.qkv_gemv = gemv_takes(T, c.hidden_size);
    p.o_gemv = gemv_takes(T, q_dim);
    p.gate_up_linear_gemv = gemv_takes(T, c.hidden_size);
    p.down_gemv = gemv_takes(T, c.intermediate_size);
  }
  p.n_sampled = static_cast<int32_t>(step.sampled_seqs.size());
  p.head_gathers = p.n_sampled != T || step.n_seqs != T;
  p.attention_splits =
      step.n_decode > 0 ? attention_decode_n_splits(step.n_decode, c.n_heads, c.n_kv_heads,
                                                    c.head_dim, step.max_decode_kv_len, ctx.n_sms)
                        : 0;
  p.attention_cascade = step.n_cascade_tasks > 0;
  p.attention_cascade_possible = step.cascade_max_tasks > 0;
  p.n_top = n_top;
  p.n_embed = step.n_embed;
  p.logprobs = step.logprobs;
  p.greedy_sampler = step.greedy_only && n_top == 0 && !step.logprobs;
  p.graph = ctx.graphs_available && o.use_cuda_graphs && step.n_prefill == 0 &&
            p.n_sampled == step.n_seqs && step.n_embed == 0;
  if (p.graph) {
    p.graph_key = (static_cast<uint64_t>(step.logprobs) << 62) |
                  (static_cast<uint64_t>(step.greedy_only) << 61) |
                  (static_cast<uint64_t>(p.attention_cascade) << 60) |
                  (static_cast<uint64_t>(step.n_seqs) << 40) |
                  (static_cast<uint64_t>(n_top) << 20) | static_cast<uint64_t>(p.attention_splits);
  }
  return p;
}

std::string ForwardPlan::describe() const {
  std::string s;
  if (n_embed > 0) s += fmt::format("embedding: lookup, then {} input embedding rows\n", n_embed);
  if (gemv_layers) {
    s += fmt::format("layers: GEMV variants\n  qkv: {}\n  o: gemv_residual_add\n",
                     qkv_path_name(qkv));
    s += gate_up_gemv ? "  gate/up: add_rmsnorm -> gemv_silu_mul\n"
                      : "  gate/up: add_rmsnorm -> cuBLAS -> silu_mul\n";
    s += "  down: gemv_residual_add\n";
  } else if (fp8) {
    const char* norm = fp8_fused_inputs[0] ? "add_rmsnorm with e4m3 output" : "add_rmsnorm";
    const char* norm2 = fp8_fused_inputs[2] ? "add_rmsnorm with e4m3 output" : "add_rmsnorm";
    s += fmt::format(
        "layers: GEMMs\n  qkv: {} -> {} -> qkv_rope\n  o: {} -> {}\n  gate/up: {} -> {}\n"
        "  down: {}\n",
        norm, fp8_path_name(fp8_paths[0]), fp8_path_name(fp8_paths[1]), norm2,
        fp8_path_name(fp8_paths[2]), fp8_fused_inputs[3] ? "silu_mul with e4m3 output" : "silu_mul",
        fp8_path_name(fp8_paths[3]));
  } else {
    s += fmt::format(
        "layers: GEMMs\n  qkv: add_rmsnorm -> {} -> qkv_rope\n  o: {} -> add_rmsnorm\n"
        "  gate/up: {} -> silu_mul\n  down: {}\n",
        via(qkv_gemv, w4), via(o_gemv, w4), via(gate_up_linear_gemv, w4), via(down_gemv, w4));
  }
  s += attention_cascade ? std::string(
                               "attention: decode with shared prefixes read once per group "
                               "(cascade tasks + merge)\n")
       : attention_splits > 0
           ? fmt::format(
                 "attention: decode with {} key splits{} (+ prefill where rows have more "
                 "than one new token)\n",
                 attention_splits,
                 attention_cascade_possible ? ", or a cascade where tables share a prefix" : "")
           : std::string("attention: prefill only\n");
  s += fmt::format("head: {}final norm -> cuBLAS LM head over {} rows\n",
                   head_gathers ? "gather sampled rows -> " : "", n_sampled);
  s += fmt::format("sampler: {}{}{}\n", greedy_sampler ? "argmax" : "general",
                   n_top > 0 ? fmt::format(" with the top {} logits", n_top) : std::string(),
                   logprobs ? ", logprobs" : "");
  s += graph ? fmt::format("launch: CUDA graph, key {:#x}\n", graph_key)
             : std::string("launch: direct\n");
  return s;
}

}  // namespace litellama
