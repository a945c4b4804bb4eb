// litellama-bench: decode and prefill step times of the CUDA model runner on a random-weight
// checkpoint of a preset shape (written in Hugging Face layout when the directory has none, so a
// reference implementation can load the same weights), and the device's copy bandwidth.
//
// A decode measurement: `batch` sequences with `context`-token prompts are prefilled (packed,
// max_batch_tokens per step), then every sequence decodes greedily, from its second step on
// through a shared-memory step ring as the worker gets steps (written as the scheduler writes
// them; the timed part starts at the worker's read of the ring: --ring 0 times StepBatch steps
// instead); warm-up steps first, then the
// host wall time of each timed step (step() ends in the step's only synchronization); the median
// is reported, with the median device time of the same steps (device_ms: ModelRunner::
// last_step_device_seconds, first copy to last; the difference is host work and launch and
// synchronisation latency). Bytes per decode step = every weight read once (the embedding table
// only for the batch's rows, the LM head in full) + every sequence's K/V at its mean kv_len; the
// fraction is those bytes over the time, against the copy bandwidth measured in the same process.
// Prefills (--prefills) run before the decode measurements; decode rows say whether they did
// (after_prefills), since earlier prefills of several 512-token sequences were measured to slow
// small-batch decode steps by 2 to 3% (bench/RESULTS.md). Output: one JSON object per line on
// stdout.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/proto/step_ring.h"
#include "kernels/block_trace.h"
#include "kernels/gpu_runtime.h"
#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/random_checkpoint.h"
#include "services/worker/ring_step.h"

namespace litellama {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device-to-device copy of `bytes` bytes; bandwidth counts bytes read plus bytes written.
double copy_bandwidth_gb_per_s(size_t bytes, int n_repeats) {
  void* a = nullptr;
  void* b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  (void)cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  (void)cudaEventCreate(&start);
  (void)cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int i = 0; i < n_repeats + 2; ++i) {
    (void)cudaEventRecord(start);
    (void)cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    (void)cudaEventRecord(stop);
    (void)cudaEventSynchronize(stop);
    float t = 0;
    (void)cudaEventElapsedTime(&t, start, stop);
    if (i >= 2) ms.push_back(t);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaFree(a);
  (void)cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

// Bytes one decode step of `batch` sequences at mean kv_len `kv_len` must read. 4-bit projections
// (quant.group_size > 0 of a 4-bit checkpoint) read half a byte per weight, a byte of zero point
// and an elem_bytes scale per group; FP8 projections a byte per weight and a float32 scale per
// output channel.
double decode_bytes(const ModelConfig& c, size_t elem_bytes, int32_t batch, double kv_len) {
  const double H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const double e = static_cast<double>(elem_bytes);
  const double q_dim = static_cast<double>(c.n_heads) * c.head_dim;
  const double kv_dim = static_cast<double>(c.n_kv_heads) * c.head_dim;
  const double projections = H * (q_dim + 2 * kv_dim) + q_dim * H + 3 * H * I;
  const bool int4 = c.quant.method != QuantMethod::kNone && c.quant.bits == 4;
  const double group = int4 ? static_cast<double>(c.quant.group_rows(c.hidden_size)) : 1.0;
  const bool fp8 = c.quant.method == QuantMethod::kFp8;
  const double projection_bytes = int4  ? projections * (0.5 + (1.0 + e) / group)
                                  : fp8 ? projections + 4.0 * ((q_dim + 2 * kv_dim) + H + 2 * I + H)
                                        : projections * e;
  const double weights = c.n_layers * (projection_bytes + 2 * H * e) + (H + V * H + batch * H) * e;
  const double kv = static_cast<double>(batch) * kv_len * c.n_layers * 2 * kv_dim * e;
  return weights + kv;
}

struct Args {
  std::string preset;
  int32_t int4_group = 0;
  bool fp8 = false;
  std::string dir;
  std::string batches = "1";
  int32_t context = 512;
  int32_t n_warmup = 5;
  int32_t n_steps = 30;
  std::string prefills;  // "1x2048,16x512"
  bool graphs = true;
  int32_t gemv = RunnerOptions{}.gemv_max_tokens;
  int32_t gemv_gate_up = RunnerOptions{}.gemv_gate_up_max_tokens;
  bool pdl = true;
  bool cascade = true;  // RunnerOptions::decode_cascade
  bool copy_bandwidth = true;
  std::string kernel_repeats;  // RunnerOptions::layer_kernel_repeats, "qkv=2,attention=0"
  // Decode sequences q and q + share_groups, q + 2 * share_groups, ... use the same slots for
  // their first share_prefix positions, as requests sharing a cached prefix do.
  int32_t share_prefix = 0;
  int32_t share_groups = 0;
  std::string block_trace;    // CSV file the block timeline of one decode step is appended to
  bool explain_plan = false;  // print each measured step's forward plan to stderr
  bool ring = true;           // decode steps through a step ring, as the worker reads them
};

// Writes decode step `step` of `n` sequences into a ring buffer as the scheduler does: sequence q's
// table at q * per_seq, whole in the ring's first step (`first`, which starts table epoch 1), else
// its new slot alone; ids are placeholders for what the previous step sampled.
void write_decode_step(const proto::StepView& v, int32_t step, bool first, int32_t per_seq,
                       const std::vector<std::vector<int32_t>>& tokens,
                       const std::vector<int32_t>& slots) {
  const auto n = static_cast<int32_t>(tokens.size());
  proto::StepHeader& h = *v.header;
  h = proto::StepHeader{};
  h.step_id = static_cast<uint64_t>(step) + 1;
  h.n_seqs = n;
  h.n_tokens = n;
  h.table_epoch = 1;
  h.epoch_start = first ? 1 : 0;
  v.token_start[0] = 0;
  v.new_slot_start[0] = 0;
  for (int32_t q = 0; q < n; ++q) {
    const auto qu = static_cast<size_t>(q);
    const auto kv = static_cast<int32_t>(tokens[qu].size());
    v.token_ids[qu] = -(q + 1);
    v.positions[qu] = kv - 1;
    v.token_start[qu + 1] = q + 1;
    v.kv_len[qu] = kv;
    v.slot_start[qu] = q * per_seq;
    const int32_t* seq_slots = slots.data() + static_cast<size_t>(q) * per_seq;
    const int32_t from = first ? 0 : kv - 1;
    std::copy(seq_slots + from, seq_slots + kv, v.new_slots.begin() + h.n_new_slots);
    h.n_new_slots += kv - from;
    v.new_slot_start[qu + 1] = h.n_new_slots;
    v.sample[qu] = 1;
    v.sampling[qu] = SamplingParams{};
    v.n_generated[qu] = step + 1;
  }
}

// Appends one traced step's records to `path` as CSV (a header when the file is new or empty).
Status append_block_trace(const std::string& path, const std::string& preset, int32_t batch,
                          double step_ms, const std::vector<BlockTraceRecord>& records) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return make_error(StatusCode::kNotFound, "cannot open {}", path);
  if (fresh) {
    std::fprintf(f,
                 "preset,batch,step_ms,kernel,variant,block,n_blocks,sm,start_ns,released_ns,"
                 "end_ns\n");
  }
  for (const BlockTraceRecord& r : records) {
    std::fprintf(
        f, "%s,%d,%.4f,%u,%u,%u,%u,%u,%llu,%llu,%llu\n", preset.c_str(), batch, step_ms, r.kernel,
        r.variant, r.block, r.n_blocks, r.sm, static_cast<unsigned long long>(r.start_ns),
        static_cast<unsigned long long>(r.released_ns), static_cast<unsigned long long>(r.end_ns));
  }
  const bool ok = std::fclose(f) == 0;
  return ok ? Status::ok() : make_error(StatusCode::kDataLoss, "cannot write {}", path);
}

std::vector<int32_t> parse_ints(const std::string& s, char sep) {
  std::vector<int32_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) v.push_back(std::stoi(item));
  }
  return v;
}

// The fields of every printed result line that say what ran: the kind of step, the model, the
// runner's configuration and the shape. (nlohmann::json orders keys, so lines print the same
// however they are built.)
nlohmann::json result_line(const Args& a, const char* kind, int32_t batch, int32_t context) {
  nlohmann::json j = {{"kind", kind},
                      {"preset", a.preset},
                      {"graphs", a.graphs},
                      {"gemv", a.gemv},
                      {"gemv_gate_up", a.gemv_gate_up},
                      {"pdl", a.pdl},
                      {"batch", batch},
                      {"context", context}};
  if (a.share_groups > 0) {
    j["share_prefix"] = a.share_prefix;
    j["share_groups"] = a.share_groups;
    j["cascade"] = a.cascade;
  }
  return j;
}

int run(const Args& a) {
  auto preset = find_random_checkpoint_preset(a.preset);
  if (!preset.is_ok()) {
    std::fprintf(stderr, "%s\n", preset.status().message().c_str());
    return 2;
  }
  if (!std::filesystem::exists(std::filesystem::path(a.dir) / "config.json")) {
    RandomCheckpointOptions wo;
    wo.storage_dtype = DType::kBF16;
    wo.int4_group = a.int4_group;
    wo.fp8 = a.fp8;
    const auto t0 = Clock::now();
    const Status written = write_random_checkpoint(a.dir, preset->config, wo);
    if (!written.is_ok()) {
      std::fprintf(stderr, "%s\n", written.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote %s in %.1f s\n", a.dir.c_str(),
                 std::chrono::duration<double>(Clock::now() - t0).count());
  }
  auto ckpt = Checkpoint::open(a.dir);
  if (!ckpt.is_ok()) {
    std::fprintf(stderr, "%s\n", ckpt.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = ckpt->config();
  auto repeats = parse_layer_kernel_repeats(a.kernel_repeats);
  if (!repeats.is_ok()) {
    std::fprintf(stderr, "%s\n", repeats.status().message().c_str());
    return 2;
  }
  const std::vector<int32_t> batches = parse_ints(a.batches, ',');
  std::vector<std::pair<int32_t, int32_t>> prefills;  // (n_seqs, tokens each)
  for (const std::string& p : [&] {
         std::vector<std::string> v;
         std::stringstream in(a.prefills);
         std::string item;
         while (std::getline(in, item, ',')) v.push_back(item);
         return v;
       }()) {
    const auto x = p.find('x');
    prefills.emplace_back(std::stoi(p.substr(0, x)), std::stoi(p.substr(x + 1)));
  }

  double bw = 0;
  if (a.copy_bandwidth) {
    bw = copy_bandwidth_gb_per_s(size_t{2} << 30, 5);
    nlohmann::json j{{"kind", "copy_bandwidth"}, {"gb_per_s", bw}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }

  RunnerOptions o;
  o.device = Device::kCuda;
  o.compute_dtype = DType::kBF16;
  o.max_batch_tokens = 8192;
  o.max_batch_seqs = std::max(256, *std::max_element(batches.begin(), batches.end()));
  o.use_cuda_graphs = a.graphs;
  o.gemv_max_tokens = a.gemv;
#if LITELLAMA_PROFILING
  o.layer_kernel_repeats = *repeats;
#else
  if (*repeats != LayerKernelRepeats{}) {
    std::fprintf(stderr, "--kernel-repeats needs a build with -DLITELLAMA_PROFILING=ON\n");
    return 2;
  }
#endif
  o.gemv_gate_up_max_tokens = a.gemv_gate_up;
  o.use_programmatic_launch = a.pdl;
  o.decode_cascade = a.cascade;
  int64_t slots = 0;
  for (int32_t b : batches) {
    slots = std::max<int64_t>(slots, int64_t{b} * (a.context + a.n_warmup + a.n_steps + 2));
  }
  for (const auto& [n, len] : prefills) slots = std::max<int64_t>(slots, int64_t{n} * len);
  o.n_kv_slots = static_cast<int32_t>(slots);
  const auto t_load = Clock::now();
  auto runner = create_model_runner(*ckpt, o);
  if (!runner.is_ok()) {
    std::fprintf(stderr, "%s\n", runner.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "loaded %s in %.1f s\n", a.preset.c_str(),
               std::chrono::duration<double>(Clock::now() - t_load).count());
  ModelRunner& r = **runner;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> id(0, c.vocab_size - 1);
  StepBatch batch;
  StepOutput out;
  // Host wall time of step() (what a caller waits), and the step's device time in *device_ms.
  auto timed_step = [&](double* ms, double* device_ms) -> bool {
    const auto t0 = Clock::now();
    const Status s = r.step(batch, &out);
    *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.is_ok()) std::fprintf(stderr, "step failed: %s\n", s.message().c_str());
    *device_ms = 1e3 * r.last_step_device_seconds().value_or(0.0);
    return s.is_ok();
  };

  for (const auto& [n, len] : prefills) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
    std::vector<int32_t> slot_ids(static_cast<size_t>(n) * len);
    std::iota(slot_ids.begin(), slot_ids.end(), 0);
    for (auto& p : prompts) {
      for (int32_t i = 0; i < len; ++i) p.push_back(id(rng));
    }
    std::vector<double> times;
    std::vector<double> device_times;
    for (int rep = 0; rep < 6; ++rep) {
      batch.clear();
      for (int32_t s = 0; s < n; ++s) {
        batch.add_sequence(
            prompts[static_cast<size_t>(s)],
            std::span(slot_ids.data() + static_cast<size_t>(s) * len, static_cast<size_t>(len)),
            true, SamplingParams{}, 0);
      }
      double ms = 0;
      double device_ms = 0;
      if (rep == 0 && a.explain_plan) {
        std::fprintf(stderr, "plan of the prefill step %dx%d:\n%s", n, len,
                     r.explain_step(batch).c_str());
      }
      if (!timed_step(&ms, &device_ms)) return 1;
      if (rep >= 2) {
        times.push_back(ms);
        device_times.push_back(device_ms);
      }
    }
    const double m = median(times);
    nlohmann::json j = result_line(a, "prefill", n, len);
    j["ms"] = m;
    j["device_ms"] = median(device_times);
    j["tokens_per_s"] = n * len / (m * 1e-3);
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }

  for (int32_t b : batches) {
    const int32_t per_seq = a.context + a.n_warmup + a.n_steps + 2;  // + a traced step
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(b));
    std::vector<int32_t> perm(static_cast<size_t>(b) * per_seq);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);  // scattered slots, as a pool in use has
    if (a.share_groups > 0) {
      const int32_t shared = std::min(a.share_prefix, a.context);
      for (int32_t q = a.share_groups; q < b; ++q) {
        std::copy_n(perm.begin() + static_cast<ptrdiff_t>(q % a.share_groups) * per_seq, shared,
                    perm.begin() + static_cast<ptrdiff_t>(q) * per_seq);
      }
    }
    auto slots_of = [&](int32_t s, size_t kv) {
      return std::span<const int32_t>(perm.data() + static_cast<size_t>(s) * per_seq, kv);
    };
    // Prefill, packed up to max_batch_tokens per step.
    int32_t s = 0;
    while (s < b) {
      batch.clear();
      int32_t budget = o.max_batch_tokens;
      std::vector<int32_t> in_step;
      while (s < b && budget >= a.context) {
        auto& t = tokens[static_cast<size_t>(s)];
        for (int32_t i = 0; i < a.context; ++i) t.push_back(id(rng));
        batch.add_sequence(t, slots_of(s, t.size()), true, SamplingParams{}, 0);
        in_step.push_back(s++);
        budget -= a.context;
      }
      double ms = 0;
      double device_ms = 0;
      if (!timed_step(&ms, &device_ms)) return 1;
      for (size_t k = 0; k < in_step.size(); ++k) {
        tokens[static_cast<size_t>(in_step[k])].push_back(out.sampled_ids[k]);
      }
    }
    // Decode through a step ring: the step is written as the scheduler writes it, then timed from
    // the worker's read of the ring (in place) to the end of step().
    proto::StepRingLimits limits{b, b, b * per_seq, 0, int64_t{b} * per_seq};
    auto ring = proto::StepRing::create("litellama-bench-" + std::to_string(getpid()), limits);
    if (!ring.is_ok()) {
      std::fprintf(stderr, "%s\n", ring.status().message().c_str());
      return 1;
    }
    if (Status st = r.register_host_memory((*ring)->data(), (*ring)->size_bytes()); !st) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;
    }
    RingStepReader reader;
    auto ring_step = [&](int32_t step, double* ms, double* device_ms) {
      const proto::StepView v = (*ring)->buffer(step % proto::kStepRingBuffers);
      write_decode_step(v, step, step == 1, per_seq, tokens, perm);
      const auto t0 = Clock::now();
      StepBatchView view;
      Status st = reader.read(v, limits, out.sampled_ids, true, &view);
      if (st.is_ok()) st = r.step(view, &out);
      *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!st.is_ok()) std::fprintf(stderr, "step failed: %s\n", st.message().c_str());
      *device_ms = 1e3 * r.last_step_device_seconds().value_or(0.0);
      return st.is_ok();
    };
    // One decode step of every sequence; false when it failed.
    auto decode_step = [&](int32_t step, double* ms, double* device_ms) {
      if (a.ring && step > 0) {
        if (!ring_step(step, ms, device_ms)) return false;
        for (int32_t q = 0; q < b; ++q) {
          tokens[static_cast<size_t>(q)].push_back(out.sampled_ids[static_cast<size_t>(q)]);
        }
        return true;
      }
      batch.clear();
      for (int32_t q = 0; q < b; ++q) {
        const auto& t = tokens[static_cast<size_t>(q)];
        batch.add_sequence(std::span(&t.back(), 1), slots_of(q, t.size()), true, SamplingParams{},
                           step + 1);
      }
      if (step == 0 && a.explain_plan) {
        std::fprintf(stderr, "plan of a decode step of batch %d:\n%s", b,
                     r.explain_step(batch).c_str());
      }
      if (!timed_step(ms, device_ms)) return false;
      for (int32_t q = 0; q < b; ++q) {
        tokens[static_cast<size_t>(q)].push_back(out.sampled_ids[static_cast<size_t>(q)]);
      }
      return true;
    };
    std::vector<double> times;
    std::vector<double> device_times;
    for (int32_t step = 0; step < a.n_warmup + a.n_steps; ++step) {
      double ms = 0;
      double device_ms = 0;
      if (!decode_step(step, &ms, &device_ms)) return 1;
      if (step >= a.n_warmup) {
        times.push_back(ms);
        device_times.push_back(device_ms);
      }
    }
    if (!a.block_trace.empty()) {
      // One more step, traced (kernels/block_trace.h).
      Status s = block_trace_start(int64_t{1} << 20);
      double ms = 0;
      double device_ms = 0;
      if (s.is_ok() && !decode_step(a.n_warmup + a.n_steps, &ms, &device_ms)) return 1;
      int64_t dropped = 0;
      if (s.is_ok()) {
        auto records = block_trace_stop(&dropped);
        s = records.is_ok() ? append_block_trace(a.block_trace, a.preset, b, ms, *records)
                            : records.status();
      }
      if (!s.is_ok()) {
        std::fprintf(stderr, "block trace: %s\n", s.message().c_str());
        return 1;
      }
      if (dropped > 0)
        std::fprintf(stderr, "block trace: %lld blocks past the capacity\n",
                     static_cast<long long>(dropped));
    }
    r.unregister_host_memory((*ring)->data());
    const double m = median(times);
    const double kv_mean = a.context + 1 + a.n_warmup + a.n_steps / 2.0;
    const double bytes = decode_bytes(c, 2, b, kv_mean);
    nlohmann::json j = result_line(a, "decode", b, a.context);
    j["after_prefills"] = !prefills.empty();
    j["kernel_repeats"] = a.kernel_repeats;
    j["ms"] = m;
    j["min_ms"] = *std::min_element(times.begin(), times.end());
    j["device_ms"] = median(device_times);
    j["tokens_per_s"] = b / (m * 1e-3);
    j["bytes"] = bytes;
    j["floor_ms"] = bw > 0 ? bytes / (bw * 1e9) * 1e3 : 0.0;
    j["bandwidth_fraction"] = bw > 0 ? bytes / (m * 1e-3) / (bw * 1e9) : 0.0;
    j["cascade_steps"] = r.cascade_steps();  // of the runner's life so far
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace litellama

int main(int argc, char** argv) {
  litellama::Args a;
  CLI::App app("litellama-bench: CUDA runner step times on a random-weight checkpoint");
  app.add_option("--preset", a.preset, "model shape (litellama make-model presets)")->required();
  app.add_option("--dir", a.dir, "checkpoint directory (written when it has no config.json)")
      ->required();
  app.add_option("--int4-group", a.int4_group,
                 "write the checkpoint's layer projections as 4-bit GPTQ in groups of this many "
                 "input rows (random codes; 0: bf16)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--fp8", a.fp8,
               "write the checkpoint's layer projections as compressed-tensors FP8 (random e4m3 "
               "codes, per-channel scales, activations per token)");
  app.add_option("--batches", a.batches, "decode batch sizes, comma-separated");
  app.add_option("--context", a.context, "prompt tokens per sequence before decoding");
  app.add_option("--warmup", a.n_warmup, "untimed decode steps");
  app.add_option("--steps", a.n_steps, "timed decode steps");
  app.add_option("--prefills", a.prefills, "prefill steps to time, e.g. 1x2048,16x512");
  app.add_option("--graphs", a.graphs, "launch decode steps as CUDA graphs (1/0)");
  app.add_option("--gemv", a.gemv,
                 "steps of at most this many tokens run the fused small-batch GEMV layers "
                 "(0: cuBLAS throughout; -1: the runner's choice by model size)");
  app.add_option(
      "--gemv-gate-up-max-tokens", a.gemv_gate_up,
      "GEMV layers: steps of at most this many tokens put gate/up through the GEMV "
      "with SiLU * up too, not cuBLAS (0: never; -1: the runner's choice by model size)");
  app.add_option("--pdl", a.pdl, "programmatic dependent launch (1/0)");
  app.add_option("--cascade", a.cascade,
                 "decode: shared prefixes read once per group of sequences (1/0)");
  app.add_option("--ring", a.ring,
                 "decode steps through a shared-memory step ring read in place, as the worker "
                 "reads them (1), or from a StepBatch (0)");
  app.add_option("--share-prefix", a.share_prefix,
                 "decode: prompt tokens whose KV slots sequences of one group share")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--share-groups", a.share_groups,
                 "decode: sequence q belongs to group q % N (0: nothing shared)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--copy-bandwidth", a.copy_bandwidth, "measure the device copy bandwidth (1/0)");
  app.add_option("--kernel-repeats", a.kernel_repeats,
                 "profiling: launches per layer of GEMV-layer kernels, e.g. qkv=2 or attention=0 "
                 "(qkv, attention, o, post_norm, gate_up, down; bench/step_breakdown.py; needs a "
                 "build with LITELLAMA_PROFILING)");
  app.add_flag("--explain-plan", a.explain_plan,
               "print the forward plan of each measured step (layer path, QKV variant, attention "
               "splits, sampler, graph key) to stderr");
  app.add_option("--block-trace", a.block_trace,
                 "profiling: after each batch's timed steps, trace one more decode step's kernel "
                 "blocks into this CSV file (appended; needs a build with LITELLAMA_PROFILING; "
                 "bench/block_timeline.py reads it)");
  CLI11_PARSE(app, argc, argv);
  return litellama::run(a);
}
