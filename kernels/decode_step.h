// The whole forward pass of a small pure-decode step as one persistent kernel: embedding, every
// layer and the LM head, for up to kDecodeStepMaxTokens sequences that each bring one token.
//
// Why: at batch 1 to 8 a decode step is a stream of weights (memory-bound), but run as one kernel
// per operation (about 11 per layer) each launch costs its ramp-up, its drain and the wait for the
// previous grid to complete, and the small kernels between the linear layers add their latency
// outright. Measured on an H200 for Llama-3.2-1B, that overhead was about half the step
// (bench/RESULTS.md). Here one grid of one block per multiprocessor stays resident for the step
// and meets at grid-wide barriers, five per layer:
//   1. every block: residual add + RMSNorm of all rows into shared memory (each block computes
//      the whole normalized input itself, so no barrier is needed for it); then the QKV
//      projection over (16-row tile, k segment) units spread over the blocks -> float32 partial
//      sums.
//   2. attention: (token, KV head, key split) items; an item sums the QKV partials of its heads,
//      adds the bias, applies RoPE, writes the new K/V into the pool (the split holding the new
//      position), and runs FlashDecoding over its keys for all query heads of its group; the last
//      split of a (token, KV head) to finish merges the splits (a counter, no barrier). A block's
//      first item has its keys' K/V rows copied into shared memory while the grid still waits
//      for the QKV projection (they were written by earlier steps).
//   3. the o projection -> partial sums.
//   4. every block: residual add + RMSNorm; the gate/up projection with SiLU(gate) * up.
//   5. the down projection -> partial sums (added to the residual by the next layer's step 1).
// Then the final norm and the LM head write float32 logits. Sampling stays a separate kernel.
// Each projection's first weights are already on their way into shared memory when its barrier
// releases (issued between the block's arrival and its wait).
//
// Status: correct (tests/gpu); on an H200 (bench/RESULTS.md, one run) slightly faster than the
// per-operation kernels at batch 1 for Llama-3.2-1B (1.083 against 1.109 ms) and Qwen2.5-1.5B
// (1.709 against 1.788 ms), slower for Llama-3.1-8B at batch 1 (4.904 against 4.676 ms) and for
// Llama-3.2-1B at batch 8 (1.414 against 1.191 ms). So the runner takes it only when asked
// (RunnerOptions::persistent_decode_max_tokens).
//
// Numerics follow the per-operation kernels (kernels/add_rmsnorm.h, qkv_rope.h, gemv.h): values
// are rounded to the compute dtype where those kernels store them; sums run in float32 in a
// different but fixed order, so results are reproducible run to run and match the other path to
// float32 summation order.
//
// Requirements (decode_step_supports): bf16/fp16; head_dim 64 or 128; n_heads a multiple of
// n_kv_heads with at most 8 query heads per KV head; hidden, n_heads * head_dim and intermediate
// size multiples of 64; no q/k RMSNorm (Qwen3 runs the per-operation path); the grid (one block
// per multiprocessor) must be co-resident, which launch_decode_step checks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace litellama {

inline constexpr int32_t kDecodeStepMaxTokens = 8;
inline constexpr int32_t kDecodeStepMaxSplits = 32;

struct DecodeStepLayer {
  const float* input_norm;  // [hidden]
  const void* qkv;          // [(n_heads + 2 n_kv_heads) * head_dim, hidden]
  const float* qkv_bias;    // [(n_heads + 2 n_kv_heads) * head_dim] or null
  const void* o;            // [hidden, n_heads * head_dim]
  const float* post_norm;   // [hidden]
  const void* gate_up;      // [2 * intermediate, hidden]
  const void* down;         // [hidden, intermediate]
  void* k_pool;             // [n_slots, n_kv_heads, head_dim]
  void* v_pool;             // [n_slots, n_kv_heads, head_dim]
};

struct DecodeStepModel {
  DType dtype = DType::kBF16;
  int32_t n_layers = 0;
  int32_t hidden = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t intermediate = 0;
  int32_t vocab = 0;
  float rms_eps = 1e-5f;
  float attention_scale = 1.0f;
  float rope_attention_scaling = 1.0f;
  bool has_qk_norm = false;
  const DecodeStepLayer* layers = nullptr;  // device array [n_layers]
  const void* embed = nullptr;              // [vocab, hidden]
  const void* lm_head = nullptr;            // [vocab, hidden]
  const float* final_norm = nullptr;        // [hidden]
};

// The step's device arrays. Sequence s owns token s (a pure decode step); its new token is at
// position positions[s] == kv_len[s] - 1 and attends to its kv_len[s] keys through the slot
// table (slot_table[slot_start[s] + i] holds position i).
struct DecodeStepInputs {
  int32_t n_tokens = 0;
  const int32_t* token_ids = nullptr;       // [n_tokens]
  const int32_t* positions = nullptr;       // [n_tokens]
  const int32_t* token_slot = nullptr;      // [n_tokens]
  const int32_t* kv_len = nullptr;          // [n_tokens]
  const int32_t* slot_start = nullptr;      // [n_tokens + 1]
  const int32_t* slot_table = nullptr;      // [sum kv_len]
  const float* inv_freq = nullptr;          // [n_freq_rows, head_dim / 2]
  const int32_t* token_freq_row = nullptr;  // [n_tokens] or null (row 0 for all)
  // Profiling, normally null: [decode_step_clock_entries(n_layers)] device clock readings (ns,
  // %globaltimer) taken by block 0 at the start, after each grid barrier (five per layer: QKV,
  // attention, o, gate/up, down) and at the end.
  uint64_t* phase_clock = nullptr;
};

inline constexpr int32_t decode_step_clock_entries(int32_t n_layers) {
  return 2 + 5 * n_layers;
}

// How one launch divides the work; a function of the shapes, the token count, the longest
// context (a hint: any kv_len is handled) and the multiprocessor count only, so a captured graph
// stays valid while contexts grow until attn_splits would change (callers key graphs on it).
struct DecodeStepPlan {
  int32_t grid = 0;     // blocks, one per multiprocessor
  int32_t seg_qkv = 1;  // k segments of the QKV / o / down projections
  int32_t seg_o = 1;
  int32_t seg_down = 1;
  int32_t attn_splits = 1;      // key splits per (token, KV head)
  int32_t attn_stage_keys = 0;  // keys of a split copied to shared memory ahead of attention
  size_t smem_bytes = 0;
};

bool decode_step_supports(const DecodeStepModel& model);

DecodeStepPlan plan_decode_step(const DecodeStepModel& model, int32_t n_tokens, int32_t max_kv_len,
                                int32_t n_sms);

// Workspace for every plan of this model with n_tokens <= kDecodeStepMaxTokens. It must be
// zero-filled once before its first use; every launch leaves its counters at zero again.
size_t decode_step_workspace_size_bytes(const DecodeStepModel& model);

// Readies the kernel for plans up to `plan` on the current device (its shared-memory limit) and
// checks that the grid can be co-resident; kUnsupported when not (a plan for the largest token
// count covers the smaller ones). launch_decode_step does it too, once per size.
Status decode_step_prepare(const DecodeStepModel& model, const DecodeStepPlan& plan);

// logits: [n_tokens, vocab] float32. Returns kUnsupported when the model is not supported or
// the grid cannot be co-resident on this device.
Status launch_decode_step(const DecodeStepModel& model, const DecodeStepInputs& inputs,
                          const DecodeStepPlan& plan, float* logits, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

}  // namespace litellama
