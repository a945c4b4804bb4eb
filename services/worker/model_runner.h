// ModelRunner: the worker's one interface to a backend (CPU or CUDA). A step is a packed batch of
// sequences, each bringing one or more new tokens (a prefill chunk or one decode token); prefill
// and decode sequences mix freely in one step. The runner owns the KV pool memory but never
// decides which slots a sequence uses: the caller names every slot in each sequence's slot table.
//
// KV contract ("token attention"): sequence s has kv_len[s] tokens after the step, at positions
// 0..kv_len[s]-1, whose K/V live in slots table[slot_start[s] + p]. The table is the runner's own
// (slot_table_capacity() entries, kept from step to step); each step writes the entries it brings
// (StepBatchView::new_slots) and the rest are what earlier steps wrote. Its n_new new tokens are
// positions kv_len[s]-n_new .. kv_len[s]-1; the runner writes their K/V into the slots of those
// positions and reads the earlier ones as cached. Slots are in [0, n_kv_slots()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/proto/sampling_params.h"
#include "common/status.h"
#include "services/worker/model_config.h"

namespace litellama {

class Checkpoint;
struct EmbeddingPoolDevice;

// Where StepBatch::embed_rows lives.
enum class EmbeddingMemory {
  kHost,    // ordinary (or shared) host memory
  kDevice,  // device memory of the runner's GPU (e.g. mapped with cudaIpcOpenMemHandle)
};

// One step's arrays as a runner reads them: spans over a StepBatch's vectors, or in place over
// a step-ring buffer (services/worker/ring_step.h). Meanings as in StepBatch, except the slot
// table: slot_start[s] is where sequence s's table starts in the runner's table, and this step
// writes the last n_w = new_slot_start[s+1] - new_slot_start[s] entries of it (positions
// kv_len[s] - n_w .. kv_len[s] - 1) from new_slots; its earlier entries are those earlier steps
// wrote. A decode step of a running sequence brings one new slot; its first step, all kv_len.
struct StepBatchView {
  std::span<const int32_t> token_ids;        // [n_tokens]
  std::span<const int32_t> positions;        // [n_tokens]
  std::span<const int32_t> token_start;      // [n_seqs + 1]
  std::span<const int32_t> kv_len;           // [n_seqs]
  std::span<const int32_t> slot_start;       // [n_seqs] table index of position 0
  std::span<const int32_t> new_slot_start;   // [n_seqs + 1] offsets into new_slots
  std::span<const int32_t> new_slots;        // [sum n_w]
  std::span<const uint8_t> sample;           // [n_seqs]
  std::span<const SamplingParams> sampling;  // [n_seqs]
  std::span<const int32_t> n_generated;      // [n_seqs]
  std::span<const int32_t> history_start;    // [n_seqs + 1] or empty
  std::span<const int32_t> history_ids;      //
  std::span<const int32_t> n_prompt;         // [n_seqs] or empty
  int32_t n_top_logits = 0;
  std::span<const int32_t> embed_token_index;  // [n_embed]
  std::span<const int32_t> embed_row_index;    // [n_embed] or empty
  const float* embed_rows = nullptr;
  EmbeddingMemory embed_rows_memory = EmbeddingMemory::kHost;
  bool logprobs = false;
  // The arrays lie in host memory registered with the runner (ModelRunner::register_host_memory),
  // so that a device backend may copy from them directly.
  bool registered = false;

  int32_t n_seqs() const { return static_cast<int32_t>(kv_len.size()); }
  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Checks sizes and ranges: ids against vocab_size, every sequence's table inside
  // [0, table_capacity), new slots against n_kv_slots. A backend that range-checks the new slots
  // while copying them passes check_slots = false and must refuse out-of-range slots itself
  // before writing them.
  Status validate(int32_t n_kv_slots, int32_t vocab_size, int64_t table_capacity,
                  bool check_slots = true) const;
};

struct StepBatch {
  // Per token, packed sequence after sequence.
  std::vector<int32_t> token_ids;  // [n_tokens]
  std::vector<int32_t> positions;  // [n_tokens]
  // Per sequence.
  std::vector<int32_t> token_start;  // [n_seqs + 1] offsets into token_ids
  std::vector<int32_t> kv_len;       // [n_seqs] tokens in the KV cache after this step
  std::vector<int32_t> slot_start;   // [n_seqs + 1] offsets into slot_table
  std::vector<int32_t> slot_table;   // [sum kv_len] KV slot of each position, in position order
  std::vector<uint8_t> sample;       // [n_seqs] 1: sample a token from this sequence's last token
  std::vector<SamplingParams> sampling;  // [n_seqs]
  std::vector<int32_t> n_generated;      // [n_seqs] tokens generated so far (keys the generator)
  // Penalty history, only read for sequences whose params have penalties: prompt then generated
  // ids of sequence s are history_ids[history_start[s] .. history_start[s+1]), the first
  // n_prompt[s] of them from the prompt. May be empty when no sequence has penalties.
  std::vector<int32_t> history_start;  // [n_seqs + 1] or empty
  std::vector<int32_t> history_ids;
  std::vector<int32_t> n_prompt;  // [n_seqs] or empty
  // Return this many largest raw logits (before penalties) of each sampled sequence; 0: none.
  int32_t n_top_logits = 0;
  // Input embeddings that replace the embedding lookup of some tokens (LLaVA's image features
  // at the image-token positions): packed token embed_token_index[j] takes row j of embed_rows
  // instead of the row of its id (which must still be a valid id, e.g. the image token). Empty:
  // every token is looked up. The rows are not owned: they stay valid and unchanged until
  // step() returns, and live where embed_rows_memory says, so that a device backend reads them
  // in place (from a pool another process exports) with no copy. A backend refuses memory it
  // cannot read (ModelRunner::supports_input_embeddings).
  std::vector<int32_t> embed_token_index;  // [n_embed] strictly increasing, in [0, n_tokens)
  // Empty: token embed_token_index[j] takes row j. Else [n_embed], each >= 0: it takes row
  // embed_row_index[j] of embed_rows, so that rows are read in place where they are not
  // contiguous or not in token order (an image's rows in a slot of the vision process's
  // EmbeddingPool, with embed_rows that pool's first row). Rows may repeat; the caller
  // guarantees every named row lies inside the memory embed_rows points to (validate() cannot
  // know its extent). A backend that reads rows only contiguously refuses it (kUnsupported).
  std::vector<int32_t> embed_row_index;
  // [n_embed, hidden_size] float32, row-major; with embed_row_index, at least one row past its
  // largest entry.
  const float* embed_rows = nullptr;
  EmbeddingMemory embed_rows_memory = EmbeddingMemory::kHost;
  // Return the logprob of each sampled sequence's token and the log-sum-exp of its raw logits
  // (StepOutput::logprobs, ::lse), for every sampled sequence of the step.
  bool logprobs = false;

  int32_t n_seqs() const { return static_cast<int32_t>(kv_len.size()); }
  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }

  // Appends one sequence. `slots` holds the slots of all kv_len positions; `new_tokens` are the
  // last new_tokens.size() positions.
  void add_sequence(std::span<const int32_t> new_tokens, std::span<const int32_t> slots,
                    bool sample_token, const SamplingParams& params, int32_t n_generated_so_far);
  // Sets the penalty history of the sequence added last (call right after add_sequence).
  void set_history(std::span<const int32_t> prompt_ids, std::span<const int32_t> generated_ids);
  void clear();
  // The batch as a runner reads it: every sequence's whole table, written at table entries
  // slot_start[s] .. slot_start[s] + kv_len[s] (the prefix sums), so that the step depends on no
  // earlier one. Valid while the batch lives unchanged.
  StepBatchView view() const;
  operator StepBatchView() const { return view(); }  // NOLINT: runners take either
};

// kInvalidArgument naming the first slot outside [0, n_kv_slots), else ok. StepBatchView::validate
// uses it, and so does a backend that range-checks the new slots itself (check_slots = false).
Status check_kv_slots(std::span<const int32_t> slots, int32_t n_kv_slots);

struct StepOutput {
  std::vector<int32_t> sampled_ids;  // [n_seqs], -1 where the sequence was not sampled
  // [n_seqs] (empty inner vector where not sampled or n_top_logits == 0): (id, raw logit),
  // largest first.
  std::vector<std::vector<std::pair<int32_t, float>>> top_logits;
  // With StepBatch::logprobs, [n_seqs] (NaN where not sampled; else empty). Of the raw logits
  // (before penalties and temperature): lse is their log-sum-exp in fp32 and logprobs the sampled
  // id's raw logit less lse; a top logit less lse is that id's logprob.
  std::vector<float> logprobs;
  std::vector<float> lse;
};

enum class Device { kCpu, kCuda };

// Profiling: launches per layer of each kernel of the CUDA runner's GEMV layer path (steps of up
// to RunnerOptions::gemv_max_tokens tokens), to measure what each kernel costs inside a decode
// step as it runs, with graphs and PDL (bench/step_breakdown.py). 1 is the normal step. 2 launches
// the kernel twice: the repeat does the same work again with the same inputs, so the outputs stay
// the same, except for o and down, which then add to the residual stream twice. 0 leaves the
// kernel out, and the kernels after it read stale buffers (wrong tokens, the same amount of work).
// qkv counts the QKV projection with its RoPE, attention the decode attention, o and down the
// projections with their residual add, post_norm the RMSNorm before gate/up, gate_up the gate/up
// projection with SiLU * up. Other paths ignore it.
struct LayerKernelRepeats {
  int32_t qkv = 1;
  int32_t attention = 1;
  int32_t o = 1;
  int32_t post_norm = 1;
  int32_t gate_up = 1;
  int32_t down = 1;
  bool operator==(const LayerKernelRepeats&) const = default;
};

// Parses "name=count,..." (the names of LayerKernelRepeats' fields, counts 0 to 2; "" keeps every
// count at 1). Unknown names, repeated names and other counts are refused.
Result<LayerKernelRepeats> parse_layer_kernel_repeats(std::string_view spec);

struct RunnerOptions {
  Device device = Device::kCpu;
  DType compute_dtype = DType::kF32;  // CPU: float32 only
  // KV pool size. 0: from kv_memory_fraction of free memory (CUDA), or four of the model's
  // contexts within kv_memory_bytes (CPU).
  int32_t n_kv_slots = 0;
  double kv_memory_fraction = 0.85;            // CUDA: share of free device memory after weights
  int64_t kv_memory_bytes = int64_t{1} << 30;  // CPU: the most the pool takes, n_kv_slots == 0
  // CUDA, n_kv_slots == 0, when > 0: vLLM's --gpu-memory-utilization, the share of the device's
  // total memory this process may hold (weights, workspaces and KV); the pool takes what is left
  // of it once the rest is allocated. Replaces kv_memory_fraction.
  double gpu_memory_utilization = 0.0;
  // CUDA, n_kv_slots == 0, when > 0: device bytes left to another process on the same GPU (the
  // vision service) whether it has started yet or not. The pool is then sized against the
  // device's total memory (gpu_memory_utilization, 0.9 when unset, less these bytes), never
  // against what happens to be free, so the start order changes nothing.
  int64_t reserve_device_bytes = 0;
  // Longest sequence served (--max-model-len); 0: the model's. Sizes the CPU's default pool.
  int64_t max_model_len = 0;
  int32_t n_threads = 0;            // CPU: 0 = all hardware threads
  int32_t max_batch_tokens = 8192;  // largest n_tokens of one step (sizes workspaces)
  int32_t max_batch_seqs = 256;     // largest n_seqs of one step
  // CUDA: launch pure decode steps as captured CUDA graphs (one per batch size); false runs every
  // kernel launch from the host, the reference the graph path is tested against.
  bool use_cuda_graphs = true;
  // CUDA, bf16/fp16: steps of at most this many tokens (at most 8) run their layers through the
  // small-batch tensor-core GEMV variants (kernels/gemv.h), which fold the residual adds and RoPE
  // into the QKV, o and down projections; other steps use cuBLAS and separate kernels. 0: never.
  // -1 (default): 8 for models of hidden size up to 2048, else 4: the limits up to which the GEMV
  // layers beat cuBLAS in the decode step (bench/RESULTS.md has the measurements).
  int32_t gemv_max_tokens = -1;
  // With the GEMV layers, steps of at most this many tokens also put gate/up through the GEMV
  // (SiLU * up in its epilogue) instead of cuBLAS followed by silu_mul. 0: never. -1 (default): 8
  // for models of hidden size up to 2048, else 4: past those limits gate/up through the GEMV
  // gains nothing over cuBLAS and loses together with the other GEMV layers.
  int32_t gemv_gate_up_max_tokens = -1;
  // CUDA, float32: batch-invariant steps (a request's ids and logits do not depend on what shares
  // its steps, on a prefix served from the cache, or on a preemption): every GEMM runs the tiled
  // kernel and attention the general kernel, both slower than cuBLAS and the tuned attention.
  // false: cuBLAS and the tuned kernels, results equal to float32 rounding only.
  bool float32_batch_invariant = true;
  // CUDA, compute capability 9.0+: kernels are launched with programmatic dependent launch, so
  // each one starts (and loads its weights) while the previous one finishes.
  bool use_programmatic_launch = true;
  // CUDA, bf16/fp16: decode sequences whose tables share a prefix of 256 keys or more (a cached
  // prefix) read it once per group of them (kernels/attention_decode.h's cascade). false: every
  // sequence reads all of its keys itself.
  bool decode_cascade = true;
  // Entries of the slot table the runner keeps (ModelRunner::slot_table_capacity); 0: the
  // default, default_slot_table_capacity().
  int64_t slot_table_capacity = 0;
#if LITELLAMA_PROFILING
  // Only in a profiling build (CMake option LITELLAMA_PROFILING; see LayerKernelRepeats).
  LayerKernelRepeats layer_kernel_repeats;
#endif
};

// Maps the embedding rows another process exports from device memory (an EmbeddingPool on a
// device: its CUDA IPC handle and GPU) into this process, for StepBatch::embed_rows with
// EmbeddingMemory::kDevice read in place. The model runner of a device backend is one.
class DeviceEmbeddingMapper {
 public:
  virtual ~DeviceEmbeddingMapper() = default;
  // The rows' `bytes`, mapped, with the pool's ready event where it exports one (a step that reads
  // the rows first waits, boundedly, for the event's latest record). kUnavailable when a handle
  // cannot be opened (another GPU without peer access, an exporter gone). Each successful map is
  // undone by one unmap.
  virtual Result<const float*> map_device_embeddings(const EmbeddingPoolDevice& pool,
                                                     uint64_t bytes) = 0;
  // Waits until no queued step reads `rows`, then unmaps them.
  virtual void unmap_device_embeddings(const float* rows) = 0;
};

class ModelRunner : public DeviceEmbeddingMapper {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int32_t n_kv_slots() const = 0;
  // Bytes the weights take where this backend keeps them: device memory on CUDA; host memory on
  // the CPU, which holds every weight (quantized ones dequantized) in float32.
  virtual int64_t weight_bytes() const = 0;
  // Entries of the runner's slot table (see the KV contract at the top).
  virtual int64_t slot_table_capacity() const = 0;
  // Runs one forward step and samples. Validates the batch first; on error nothing was written
  // (neither the KV pool nor the slot table).
  virtual Status step(const StepBatchView& batch, StepOutput* out) = 0;
  // Lets a device backend copy from [data, data + bytes) directly (CUDA: page-locks it with
  // cudaHostRegister) until unregister_host_memory; a no-op where there is no device. The worker
  // registers its step ring.
  virtual Status register_host_memory(void* data, size_t bytes) { return Status::ok(); }
  virtual void unregister_host_memory(void* data) {}
  // Whether step() takes StepBatch::embed_rows in `memory`; a batch with rows elsewhere is
  // refused with kUnsupported.
  virtual bool supports_input_embeddings(EmbeddingMemory memory) const { return false; }
  // DeviceEmbeddingMapper: kUnsupported where the backend has no device.
  Result<const float*> map_device_embeddings(const EmbeddingPoolDevice& pool,
                                             uint64_t bytes) override {
    return make_error(StatusCode::kUnsupported, "this backend reads no device embedding pool");
  }
  void unmap_device_embeddings(const float* rows) override {}
  // Device time of the last successful step, from the start of its host-to-device copy to the end
  // of its device-to-host copy (CUDA events on the step's stream); the rest of the step's wall
  // time is host work and launch/synchronisation latency. nullopt where the backend has no
  // separate device (CPU) or no step ran yet.
  virtual std::optional<double> last_step_device_seconds() const { return std::nullopt; }
  // For the last step that read image rows of a device embedding pool whose exporter stamps when
  // rows are complete (EmbeddingPoolDevice::finished_ns_offset) on this GPU: the GPU time from
  // that stamp to the step's first read of the rows. nullopt otherwise (no such rows, another
  // GPU, no device clock).
  virtual std::optional<double> last_image_handoff_seconds() const { return std::nullopt; }
  // Steps launched as a CUDA graph: replays of a graph an earlier step captured, and steps that
  // captured one (each pure decode step of a new batch shape runs eagerly first, captures on its
  // second sight and replays after). Always 0 where there are no graphs.
  virtual int64_t graph_replays() const { return 0; }
  virtual int64_t graph_captures() const { return 0; }
  // Steps whose decode attention ran as a shared-prefix cascade (RunnerOptions::decode_cascade);
  // always 0 where there is none.
  virtual int64_t cascade_steps() const { return 0; }
  // What a step of `batch` would run, one decision per line (litellama-bench --explain-plan);
  // runs nothing.
  virtual std::string explain_step(const StepBatchView& batch) const = 0;
};

// The GEMV layers' token limit a CUDA runner uses: options.gemv_max_tokens, or for -1 (the
// default) 8 for models of hidden size up to 2048 and 4 above.
int32_t resolved_gemv_max_tokens(const RunnerOptions& options, int32_t hidden_size);
// Likewise for the gate/up GEMV: options.gemv_gate_up_max_tokens, or for -1 8 up to hidden size
// 2048 and 4 above.
int32_t resolved_gemv_gate_up_max_tokens(const RunnerOptions& options, int32_t hidden_size);

// Four pools' worth of table entries (room for the tables of one step, laid out twice, and for
// their growth until the scheduler lays them out afresh) and 16 per sequence for rounding; at
// most INT32_MAX, as table indices are int32.
int64_t default_slot_table_capacity(int32_t n_kv_slots, int32_t max_batch_seqs);

// The compute dtype for `requested` ("" or "auto", else a torch name: float32, bfloat16, float16)
// on `device`. "auto" is float32 on the CPU (its only dtype) and, on CUDA, the checkpoint's own
// half type (bfloat16 or float16), bfloat16 for float32 checkpoints. Unknown names are refused.
Result<DType> resolve_compute_dtype(Device device, std::string_view requested,
                                    DType checkpoint_dtype);

// Builds the runner for options.device from a loaded checkpoint. Unsupported devices, dtypes or
// shapes are refused here with a clear message.
Result<std::unique_ptr<ModelRunner>> create_model_runner(const Checkpoint& checkpoint,
                                                         const RunnerOptions& options);

}  // namespace litellama
