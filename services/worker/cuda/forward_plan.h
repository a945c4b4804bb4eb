// Which kernels a CUDA step runs, decided in one place before any launch.
//
// plan_forward() looks at the step's shape (StepPlan), the model, the resolved runner options and
// the device, and fixes every choice the launch code follows: the layers' path (cuBLAS GEMMs with
// separate element-wise kernels, or the small-batch GEMV variants whose epilogues do that work),
// the QKV variant, whether gate/up goes through the GEMV, whether the head gathers the sampled
// rows, decode attention's key-split count, which sampler kernel runs, and whether the step
// launches through a captured graph under which key. The runner's launch code decides nothing
// itself, so the plan is the whole answer to "what does this batch run", and describe() prints it
// (litellama-bench --explain-plan).
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "kernels/linear_fp8.h"
#include "services/worker/cuda/step_staging.h"
#include "services/worker/model_config.h"
#include "services/worker/model_runner.h"

namespace litellama {

// How a layer's QKV projection, its RoPE and the K/V pool writes run.
enum class QkvPath {
  kLinearThenRope,     // add_rmsnorm -> linear (GEMV or cuBLAS) -> qkv_rope
  kNormThenGemvRope,   // add_rmsnorm -> gemv_qkv_rope (RoPE and the pool in the GEMV's epilogue)
  kFoldedNormGemvRope  // gemv_qkv_rope with the input norm folded into the weights (bf16)
};

struct ForwardPlan {
  // Layers through the small-batch GEMV variants (kernels/gemv.h) instead of cuBLAS.
  bool gemv_layers = false;
  QkvPath qkv = QkvPath::kLinearThenRope;
  // On the cuBLAS layer path, which projections still take the GEMV (rows and width it
  // supports): the QKV, o, gate/up and down projections.
  bool qkv_gemv = false, o_gemv = false, gate_up_linear_gemv = false, down_gemv = false;
  // 4-bit projections (ForwardPlanContext::w4_group > 0): the layers take the GEMM path, and
  // the flags above say which projections the W4 GEMV takes (kernels/linear_w4.h); the others are
  // dequantized into a workspace and multiplied by cuBLAS (the tiled kernel in float32).
  bool w4 = false;
  // FP8 projections (ForwardPlanContext::fp8): the layers take the GEMM path and each projection
  // the path of kernels/linear_fp8.h given here, in the order qkv, o, gate/up, down.
  bool fp8 = false;
  Fp8Path fp8_paths[4] = {Fp8Path::kDequantize, Fp8Path::kDequantize, Fp8Path::kDequantize,
                          Fp8Path::kDequantize};
  // Which of those inputs the kernel before the projection writes as e4m3 (the FP8 GEMM's input:
  // launch_add_rmsnorm_fp8 before qkv and gate/up, launch_silu_mul_fp8 before down); the o
  // projection's input, attention's output, is quantized by launch_fp8_linear itself.
  bool fp8_fused_inputs[4] = {false, false, false, false};
  // GEMV layer path: gate/up through gemv_silu_mul (else cuBLAS + silu_mul).
  bool gate_up_gemv = false;
  // The head gathers the sampled rows before the final norm (false when they are all the rows,
  // in order: a pure decode step).
  bool head_gathers = false;
  int32_t n_sampled = 0;
  int32_t n_embed = 0;           // input embedding rows scattered over the looked-up embeddings
  int32_t attention_splits = 0;  // decode attention's key splits (0: no decode sequence)
  // Decode attention as a shared-prefix cascade (StepPlan::n_cascade_tasks > 0), and whether the
  // step's layout allows one (fill_step decides from the tables).
  bool attention_cascade = false;
  bool attention_cascade_possible = false;
  // The argmax kernel (every row greedy, no penalties, no top-N, no logprobs).
  bool greedy_sampler = false;
  int32_t n_top = 0;
  bool logprobs = false;  // the sampler returns logprobs and log-sum-exps
  // Launched through the graph runner under graph_key (a pure decode step with graphs on).
  bool graph = false;
  uint64_t graph_key = 0;

  // One line per decision, for people.
  std::string describe() const;
};

// The device and model facts a plan depends on.
struct ForwardPlanContext {
  const ModelConfig* config = nullptr;
  // Resolved: gemv_max_tokens and gemv_gate_up_max_tokens are never -1 here.
  const RunnerOptions* options = nullptr;
  DType dtype = DType::kF32;
  int32_t n_sms = 0;
  bool input_norms_folded = false;  // the weights have the input norms folded into W.qkv
  bool graphs_available = false;    // graphs on and no capture has failed
  int32_t w4_group = 0;   // the layers' projections are 4-bit in groups of this many rows; 0: dense
  bool fp8 = false;       // the layers' projections are FP8
  bool fp8_gemm = false;  // the runner has an FP8 GEMM (kernels/linear_fp8.h, Fp8Gemm)
};

ForwardPlan plan_forward(const StepPlan& step, int32_t n_top, const ForwardPlanContext& ctx);

}  // namespace litellama
