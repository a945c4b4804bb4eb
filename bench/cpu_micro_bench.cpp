// Micro-benchmarks of the CPU-side hot spots (Google Benchmark): tokenizer encode and streaming
// decode, the CPU sampler over a real vocabulary, one CPU-runner decode step of a tiny model, and
// the scheduler's planning of a step in a full pool, with and without the prefix cache.
// Run: build/bin/litellama-micro-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "common/proto/step_ring.h"
#include "services/scheduler/continuous_batcher.h"
#include "services/tokenizer/incremental_detokenizer.h"
#include "services/tokenizer/tokenizer.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cpu_sampler.h"
#include "services/worker/model_runner.h"
#include "services/worker/random_checkpoint.h"
#include "services/worker/ring_step.h"

namespace litellama {
namespace {

#ifndef LITELLAMA_SOURCE_DIR
#define LITELLAMA_SOURCE_DIR "."
#endif

const Tokenizer* llama3_tokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::load(std::string(LITELLAMA_SOURCE_DIR) + "/assets/tokenizers/llama3_1");
    return t.is_ok() ? new Tokenizer(std::move(t).value()) : nullptr;
  }();
  return tok;
}

std::string sample_text() {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += "The quick brown fox jumps over the lazy dog; numbers 12345 and émoji 🦊 ";
    text += "日本語のテキスト, код на русском, and code: for (int i = 0; i < n; ++i) {}\n";
  }
  return text;
}

void BM_TokenizerEncode(benchmark::State& state) {
  const Tokenizer* tok = llama3_tokenizer();
  if (!tok) {
    state.SkipWithError("assets/tokenizers/llama3_1 missing (run scripts/fetch-assets.sh)");
    return;
  }
  const std::string text = sample_text();
  for (auto _ : state) benchmark::DoNotOptimize(tok->encode(text));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond);

void BM_IncrementalDetokenize(benchmark::State& state) {
  const Tokenizer* tok = llama3_tokenizer();
  if (!tok) {
    state.SkipWithError("assets/tokenizers/llama3_1 missing (run scripts/fetch-assets.sh)");
    return;
  }
  const auto ids = tok->encode(sample_text());
  for (auto _ : state) {
    IncrementalDetokenizer detok(*tok);
    size_t n = 0;
    for (size_t i = 0; i < ids.size(); ++i) n += detok.push({&ids[i], 1}).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_IncrementalDetokenize)->Unit(benchmark::kMillisecond);

void BM_CpuSampler(benchmark::State& state) {
  std::vector<float> logits(128256);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& l : logits) l = normal(rng);
  SamplingParams p;
  p.temperature = state.range(0) ? 0.8f : 0.0f;
  p.top_k = state.range(0) ? 50 : 0;
  p.top_p = state.range(0) ? 0.9f : 1.0f;
  int64_t n = 0;
  std::vector<float> work(logits.size());
  for (auto _ : state) {
    work = logits;
    SamplingInput in;
    in.n_generated = n++;
    benchmark::DoNotOptimize(sample_token(work, p, in));
  }
}
BENCHMARK(BM_CpuSampler)->Arg(0)->Arg(1)->ArgNames({"top_k_top_p"});

void BM_CpuDecodeStep(benchmark::State& state) {
  const auto dir = std::filesystem::temp_directory_path() / "litellama-micro-bench-default";
  if (!std::filesystem::exists(dir / "model.safetensors")) {
    auto preset = find_random_checkpoint_preset("default-random");
    RandomCheckpointOptions options;
    options.storage_dtype = DType::kBF16;
    if (!preset.is_ok() ||
        !write_random_checkpoint(dir.string(), preset->config, options).is_ok()) {
      state.SkipWithError("cannot write the default model");
      return;
    }
  }
  auto ckpt = Checkpoint::open(dir.string());
  RunnerOptions options;
  options.n_kv_slots = 4096;
  auto runner = create_model_runner(*ckpt, options);
  if (!runner.is_ok()) {
    state.SkipWithError(runner.status().message().c_str());
    return;
  }
  const auto batch_size = static_cast<int32_t>(state.range(0));
  const int32_t context = 128;
  std::vector<int32_t> prompt(context);
  std::iota(prompt.begin(), prompt.end(), 1000);
  StepBatch prefill;
  std::vector<std::vector<int32_t>> slots(batch_size);
  for (int32_t s = 0; s < batch_size; ++s) {
    for (int32_t i = 0; i <= context; ++i) slots[s].push_back(s * (context + 1) + i);
    prefill.add_sequence(prompt, std::span<const int32_t>(slots[s]).first(context), true, {}, 0);
  }
  StepOutput out;
  if (!(*runner)->step(prefill, &out).is_ok()) {
    state.SkipWithError("prefill failed");
    return;
  }
  StepBatch decode;
  for (int32_t s = 0; s < batch_size; ++s) {
    const int32_t tok = out.sampled_ids[s];
    decode.add_sequence(std::span<const int32_t>(&tok, 1), slots[s], true, {}, 1);
  }
  for (auto _ : state) benchmark::DoNotOptimize((*runner)->step(decode, &out).is_ok());
  state.SetItemsProcessed(state.iterations() * batch_size);
}
BENCHMARK(BM_CpuDecodeStep)->Arg(1)->Arg(8)->ArgNames({"batch"})->Unit(benchmark::kMillisecond);

// The worker's host work before a decode step of `batch` sequences at 520 keys runs: reading it
// from the step ring in place (one new slot per sequence; the tables were sent in the epoch's
// first step) and validating it.
void BM_DecodeStepRingRead(benchmark::State& state) {
  const auto batch_size = static_cast<int32_t>(state.range(0));
  const int32_t kv_len = 520;
  const proto::StepRingLimits limits{batch_size, batch_size, batch_size * kv_len, 0,
                                     int64_t{batch_size} * kv_len};
  auto ring = proto::StepRing::create("litellama-bench-ring-read", limits);
  if (!ring.is_ok()) {
    state.SkipWithError(ring.status().message().c_str());
    return;
  }
  const proto::StepView v = (*ring)->buffer(0);
  // Every table whole (the epoch's first step), then the steady decode step.
  auto write = [&](bool first) {
    proto::StepHeader& h = *v.header;
    h = proto::StepHeader{};
    h.n_seqs = h.n_tokens = batch_size;
    h.table_epoch = 1;
    h.epoch_start = first ? 1 : 0;
    for (int32_t s = 0; s < batch_size; ++s) {
      const auto su = static_cast<size_t>(s);
      v.token_ids[su] = 7;
      v.positions[su] = kv_len - 1;
      v.token_start[su + 1] = s + 1;
      v.kv_len[su] = kv_len;
      v.slot_start[su] = s * kv_len;
      for (int32_t p = first ? 0 : kv_len - 1; p < kv_len; ++p) {
        v.new_slots[static_cast<size_t>(h.n_new_slots++)] = s * kv_len + p;
      }
      v.new_slot_start[su + 1] = h.n_new_slots;
      v.sample[su] = 1;
      v.sampling[su] = SamplingParams{};
      v.n_generated[su] = 1;
    }
  };
  RingStepReader reader;
  StepBatchView batch;
  write(true);
  (void)reader.read(v, limits, {}, false, &batch);
  write(false);
  const int32_t n_slots = batch_size * kv_len;
  for (auto _ : state) {
    Status st = reader.read(v, limits, {}, false, &batch);
    if (st.is_ok()) st = batch.validate(n_slots, 128256, limits.table_capacity);
    if (!st.is_ok()) {
      state.SkipWithError(st.message().c_str());
      return;
    }
    benchmark::DoNotOptimize(batch);
  }
  state.SetItemsProcessed(state.iterations() * batch_size);
}
BENCHMARK(BM_DecodeStepRingRead)
    ->Arg(1)
    ->Arg(64)
    ->Arg(256)
    ->ArgNames({"batch"})
    ->Unit(benchmark::kMicrosecond);

// The scheduler's share of a decode step in the steady state that serving without shared
// prefixes reaches: 256 running requests of distinct 512-token prompts and 128 new tokens, a
// pool of 200k slots long since full of cached prefixes nobody reuses (with the cache on, each
// new token's slot comes from evicting one). Time per plan + complete of one step.
void BM_BatcherSteadyStep(benchmark::State& state) {
  constexpr int32_t kRunning = 256, kPrompt = 512, kOutput = 128, kPool = 200000;
  KvSlotAllocator allocator(kPool);
  BatcherOptions options;
  options.max_batch_tokens = 8192;
  options.max_batch_seqs = kRunning;
  options.prefix_cache = state.range(0) != 0;
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(128256, 0, {});
  auto ring = proto::StepRing::create(
      "litellama-bench-batcher", {8192, kRunning, kPool, 0, 4 * int64_t{kPool} + 16 * kRunning});
  if (!ring.is_ok()) {
    state.SkipWithError(ring.status().message().c_str());
    return;
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(0, 128000);
  std::deque<std::unique_ptr<Request>> live;
  uint64_t next_id = 1, step_id = 1;
  auto enqueue = [&] {
    auto r = std::make_unique<Request>();
    r->id = next_id++;
    for (int32_t k = 0; k < kPrompt; ++k) r->prompt_ids.push_back(id(rng));
    r->max_tokens = kOutput;
    r->ignore_eos = true;
    batcher.enqueue(r.get());
    live.push_back(std::move(r));
  };
  std::vector<Request*> rejected, updated;
  auto one_step = [&] {
    while (batcher.n_running() + batcher.n_waiting() < kRunning) enqueue();
    auto plan = batcher.plan(step_id, (*ring)->buffer(0), (*ring)->limits(), &rejected);
    if (!plan) return false;
    std::vector<int32_t> sampled(plan->request_ids.size(), 11);
    updated.clear();
    batcher.complete(*plan, sampled, &updated);
    ++step_id;
    while (!live.empty() && live.front()->state == RequestState::kFinished) live.pop_front();
    return true;
  };
  // Until the pool has been full for a while: 40 generations of the running batch.
  for (int i = 0; i < 40 * kOutput; ++i) {
    if (!one_step()) {
      state.SkipWithError("nothing to plan");
      return;
    }
  }
  for (auto _ : state) {
    if (!one_step()) {
      state.SkipWithError("nothing to plan");
      return;
    }
  }
  state.counters["cached_slots"] = batcher.cache().n_cached_slots();
}
BENCHMARK(BM_BatcherSteadyStep)
    ->Arg(0)
    ->Arg(1)
    ->ArgNames({"prefix_cache"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace litellama

BENCHMARK_MAIN();
