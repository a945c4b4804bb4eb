// plan_forward (services/worker/cuda/forward_plan.h): the decisions a CUDA step follows, from the
// step's shape, the model and the options alone. Host code: no device needed.
#include "services/worker/cuda/forward_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_decode.h"
#include "kernels/linear_w4.h"
#include "services/worker/cuda/step_staging.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

ModelConfig preset_config(const std::string& name) {
  auto preset = find_random_checkpoint_preset(name);
  EXPECT_TRUE(preset.is_ok()) << preset.status().message();
  nlohmann::json j = preset->config;
  j["torch_dtype"] = "bfloat16";
  auto c = parse_model_config(j);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return *c;
}

// n_decode sequences of one new token each (context `kv` each) and, when prefill_len > 0, one
// sequence of prefill_len new tokens; every sequence sampled, greedy unless `sampled`.
StepBatch make_batch(int32_t n_decode, int32_t kv, int32_t prefill_len, bool sampled) {
  StepBatch b;
  std::vector<int32_t> slots(static_cast<size_t>(kv + prefill_len));
  std::iota(slots.begin(), slots.end(), 0);
  SamplingParams p;
  if (sampled) p.temperature = 0.8f;
  const std::vector<int32_t> one{5};
  for (int32_t s = 0; s < n_decode; ++s) {
    b.add_sequence(one, std::span(slots.data(), static_cast<size_t>(kv)), true, p, 1);
  }
  if (prefill_len > 0) {
    const std::vector<int32_t> prompt(static_cast<size_t>(prefill_len), 7);
    b.add_sequence(prompt, std::span(slots.data(), static_cast<size_t>(prefill_len)), true, p, 0);
  }
  return b;
}

struct Fixture {
  ModelConfig config;
  RunnerOptions options;
  ForwardPlanContext ctx;
  explicit Fixture(const std::string& preset) : config(preset_config(preset)) {
    options.device = Device::kCuda;
    options.compute_dtype = DType::kBF16;
    options.gemv_max_tokens = resolved_gemv_max_tokens(options, config.hidden_size);
    options.gemv_gate_up_max_tokens = resolved_gemv_gate_up_max_tokens(options, config.hidden_size);
    ctx.config = &config;
    ctx.options = &options;
    ctx.dtype = DType::kBF16;
    ctx.n_sms = 132;
    ctx.input_norms_folded = true;
    ctx.graphs_available = true;
  }
  ForwardPlan plan(const StepBatch& b, int32_t n_top = 0) const {
    return plan_forward(plan_step(b, config), n_top, ctx);
  }
};

TEST(ForwardPlan, SmallDecodeStepsTakeTheGemvLayersAndAGraph) {
  Fixture f("llama3.2-1b");
  const ForwardPlan p = f.plan(make_batch(1, 100, 0, false));
  EXPECT_TRUE(p.gemv_layers);
  EXPECT_EQ(p.qkv, QkvPath::kFoldedNormGemvRope);
  EXPECT_TRUE(p.gate_up_gemv);
  EXPECT_FALSE(p.head_gathers);
  EXPECT_GT(p.attention_splits, 0);
  EXPECT_TRUE(p.greedy_sampler);
  EXPECT_TRUE(p.graph);
  // The key changes with what the launches depend on.
  EXPECT_NE(f.plan(make_batch(2, 100, 0, false)).graph_key, p.graph_key);
  EXPECT_NE(f.plan(make_batch(1, 100, 0, true)).graph_key, p.graph_key);
  EXPECT_NE(f.plan(make_batch(1, 100, 0, false), 4).graph_key, p.graph_key);
  EXPECT_EQ(f.plan(make_batch(1, 101, 0, false)).graph_key, p.graph_key);
  StepBatch with_logprobs = make_batch(1, 100, 0, false);
  with_logprobs.logprobs = true;
  const ForwardPlan lp = f.plan(with_logprobs);
  EXPECT_NE(lp.graph_key, p.graph_key);
  EXPECT_FALSE(lp.greedy_sampler);
  const std::string text = p.describe();
  EXPECT_NE(text.find("GEMV variants"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA graph"), std::string::npos) << text;

  f.ctx.input_norms_folded = false;
  EXPECT_EQ(f.plan(make_batch(1, 100, 0, false)).qkv, QkvPath::kNormThenGemvRope);
  f.ctx.graphs_available = false;
  EXPECT_FALSE(f.plan(make_batch(1, 100, 0, false)).graph);
}

TEST(ForwardPlan, LargeAndMixedStepsTakeGemmsEagerly) {
  Fixture f("llama3.2-1b");
  const ForwardPlan big = f.plan(make_batch(64, 100, 0, true));
  EXPECT_FALSE(big.gemv_layers);
  EXPECT_FALSE(big.qkv_gemv || big.o_gemv || big.gate_up_linear_gemv || big.down_gemv);
  EXPECT_FALSE(big.greedy_sampler);
  EXPECT_TRUE(big.graph);  // pure decode
  // A prefill mixed in: the head gathers the last rows and no graph runs.
  const ForwardPlan mixed = f.plan(make_batch(3, 100, 40, false));
  EXPECT_FALSE(mixed.gemv_layers);
  EXPECT_TRUE(mixed.head_gathers);
  EXPECT_FALSE(mixed.graph);
  EXPECT_NE(mixed.describe().find("gather"), std::string::npos);
  // gate/up leaves the GEMV above its own limit.
  f.options.gemv_gate_up_max_tokens = 2;
  const ForwardPlan four = f.plan(make_batch(4, 100, 0, false));
  EXPECT_TRUE(four.gemv_layers);
  EXPECT_FALSE(four.gate_up_gemv);
  f.options.gemv_max_tokens = 0;
  EXPECT_FALSE(f.plan(make_batch(1, 100, 0, false)).gemv_layers);
}

TEST(ForwardPlan, InputEmbeddingRowsAreScatteredAndNeverGraphed) {
  Fixture f("llama3.2-1b");
  StepBatch b = make_batch(1, 100, 0, false);
  const std::vector<float> rows(static_cast<size_t>(f.config.hidden_size));
  b.embed_token_index = {0};
  b.embed_rows = rows.data();
  b.embed_rows_memory = EmbeddingMemory::kDevice;
  const ForwardPlan p = f.plan(b);
  EXPECT_EQ(p.n_embed, 1);
  EXPECT_FALSE(p.graph);
  EXPECT_NE(p.describe().find("1 input embedding rows"), std::string::npos) << p.describe();
}

TEST(ForwardPlan, QkNormModelsRopeOutsideTheGemv) {
  Fixture f("qwen3-tiny");
  const ForwardPlan p = f.plan(make_batch(1, 10, 0, false));
  ASSERT_TRUE(p.gemv_layers);
  EXPECT_EQ(p.qkv, QkvPath::kLinearThenRope);
}

// 4-bit projections: the GEMM layer path, each projection on the W4 GEMV up to its row limit
// (CUDA builds; portable builds dequantize at every size), and the plan says so.
TEST(ForwardPlan, FourBitProjectionsSayWhichKernelTakesThem) {
  Fixture f("llama3.1-8b");
  f.options.gemv_max_tokens = 0;  // as the runner sets it for quantized models
  f.ctx.input_norms_folded = false;
  f.ctx.w4_group = 128;
  const ForwardPlan one = f.plan(make_batch(1, 100, 0, false));
  EXPECT_FALSE(one.gemv_layers);
  EXPECT_TRUE(one.w4);
  const bool gemv = w4_gemv_supports(DType::kBF16, 1, f.config.hidden_size, 128);
  EXPECT_EQ(one.qkv_gemv && one.o_gemv && one.gate_up_linear_gemv && one.down_gemv, gemv);
  EXPECT_NE(one.describe().find(gemv ? "W4 GEMV" : "W4 dequantize"), std::string::npos)
      << one.describe();
  const ForwardPlan big = f.plan(make_batch(kW4GemvMaxRows + 1, 100, 0, false));
  EXPECT_FALSE(big.qkv_gemv || big.o_gemv || big.gate_up_linear_gemv || big.down_gemv);
  EXPECT_NE(big.describe().find("W4 dequantize -> GEMM"), std::string::npos) << big.describe();
  EXPECT_TRUE(big.graph);  // pure decode: graphed as for dense weights
}

TEST(ForwardPlan, Fp8ProjectionsSayWhichPathTakesThemAndWhoQuantizes) {
  Fixture f("llama3.1-8b");
  f.options.gemv_max_tokens = 0;
  f.ctx.input_norms_folded = false;
  f.ctx.fp8 = true;
  f.ctx.fp8_gemm = true;
  const ForwardPlan one = f.plan(make_batch(1, 100, 0, false));
  EXPECT_FALSE(one.gemv_layers);
  EXPECT_TRUE(one.fp8);
  const Fp8Path small = fp8_linear_path(DType::kBF16, 1, f.config.hidden_size, true);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(one.fp8_paths[i], small);
    // Portable builds have no FP8 GEMV: one token takes the GEMM, its inputs quantized upstream.
    EXPECT_EQ(one.fp8_fused_inputs[i], i != 1 && small == Fp8Path::kGemm);
  }
  EXPECT_NE(one.describe().find(fp8_path_name(small)), std::string::npos) << one.describe();
  const ForwardPlan big = f.plan(make_batch(kFp8GemvMaxRows + 1, 100, 0, false));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(big.fp8_paths[i], Fp8Path::kGemm);
  // The norms and silu_mul quantize for the GEMM; attention's output is quantized by the linear.
  EXPECT_TRUE(big.fp8_fused_inputs[0] && big.fp8_fused_inputs[2] && big.fp8_fused_inputs[3]);
  EXPECT_FALSE(big.fp8_fused_inputs[1]);
  EXPECT_NE(big.describe().find("silu_mul with e4m3 output"), std::string::npos) << big.describe();
  f.ctx.fp8_gemm = false;  // no FP8 tensor cores: the dequantizing path, nothing quantized
  const ForwardPlan old = f.plan(make_batch(kFp8GemvMaxRows + 1, 100, 0, false));
  EXPECT_EQ(old.fp8_paths[3], Fp8Path::kDequantize);
  EXPECT_FALSE(old.fp8_fused_inputs[3]);
}

// Decode sequences reach attention ordered by their tables' first slot (those sharing a cached
// prefix side by side), stably; prefill sequences follow in batch order.
TEST(StepStaging, DecodeWorkIsOrderedByFirstSlot) {
  const ModelConfig config = preset_config("llama3.2-1b");
  StepBatch b;
  const SamplingParams p;
  const std::vector<int32_t> one{5}, three{5, 6, 7};
  const std::vector<std::vector<int32_t>> tables{
      {10, 11, 12}, {3, 4, 5}, {20, 21, 22}, {10, 11, 13}, {3, 4, 6}};
  b.add_sequence(three, tables[2], true, p, 0);  // prefill
  for (const auto& t : tables) b.add_sequence(one, t, true, p, 1);
  b.add_sequence(three, tables[0], true, p, 0);  // prefill
  const StepBatchView v = b.view();
  StepPlan plan = plan_step(v, config);
  ASSERT_EQ(plan.n_decode, 5);
  ASSERT_EQ(plan.n_prefill, 2);
  std::vector<int32_t> table(b.slot_table.size());
  std::vector<char> host(plan.layout.total_bytes);
  ASSERT_TRUE(fill_step(v, config, &plan, 64, true, table.data(), host.data()).is_ok());
  const auto* work = reinterpret_cast<const int32_t*>(host.data() + plan.layout.work_seqs);
  EXPECT_EQ(std::vector<int32_t>(work, work + 7), (std::vector<int32_t>{2, 5, 1, 4, 3, 0, 6}));
}

// The cascade plan against a brute-force check over random groupings: every key of every decode
// sequence is covered by exactly one of the tasks listing it, that task's table holds the
// sequence's own slot for every key it covers, its members fit one tile, parts are numbered
// per work item, and prefix tasks cover groups only.
TEST(StepStaging, CascadeTasksCoverEveryKeyOnceFromTheSequencesOwnSlots) {
  const ModelConfig config = preset_config("llama3.2-1b");  // 32 heads over 8 KV heads
  const CascadeOptions opts{4, 132};
  std::mt19937 rng(7);
  int32_t cascaded = 0;
  for (int round = 0; round < 40; ++round) {
    const int32_t n = std::uniform_int_distribution<int32_t>(16, 40)(rng);
    const int32_t n_groups = std::uniform_int_distribution<int32_t>(1, 8)(rng);
    std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(n_groups));
    int32_t next = 0;
    for (auto& pre : prefixes) {
      const int32_t len = std::uniform_int_distribution<int32_t>(0, 900)(rng);
      for (int32_t i = 0; i < len; ++i) pre.push_back(next++);
    }
    StepBatch b;
    const std::vector<int32_t> one{5};
    std::vector<std::vector<int32_t>> tables;
    for (int32_t s = 0; s < n; ++s) {
      std::vector<int32_t> t = prefixes[static_cast<size_t>(rng() % n_groups)];
      const int32_t own = std::uniform_int_distribution<int32_t>(1, 300)(rng);
      for (int32_t i = 0; i < own; ++i) t.push_back(next++);
      tables.push_back(t);
      b.add_sequence(one, tables.back(), true, SamplingParams{}, 1);
    }
    const StepBatchView v = b.view();
    StepPlan plan = plan_step(v, config, /*cascade=*/true);
    ASSERT_GT(plan.cascade_max_tasks, 0);
    std::vector<int32_t> table(b.slot_table.size());
    std::vector<char> host(plan.layout.total_bytes);
    ASSERT_TRUE(fill_step(v, config, &plan, next, true, table.data(), host.data(), opts).is_ok());
    if (plan.n_cascade_tasks == 0) continue;
    ++cascaded;
    auto arr = [&](size_t off) { return reinterpret_cast<const int32_t*>(host.data() + off); };
    const int32_t* work = arr(plan.layout.work_seqs);
    const int32_t* tasks = arr(plan.layout.cascade_tasks);
    const int32_t* members = arr(plan.layout.cascade_members);
    const int32_t* part_start = arr(plan.layout.cascade_part_start);
    ASSERT_EQ(*arr(plan.layout.cascade_n_tasks), plan.n_cascade_tasks);
    ASSERT_LE(plan.n_cascade_tasks, plan.cascade_max_tasks);
    ASSERT_LE(part_start[n], plan.cascade_max_parts);
    std::vector<int32_t> work_of(static_cast<size_t>(n));
    for (int32_t w = 0; w < n; ++w) work_of[static_cast<size_t>(work[w])] = w;
    // covered[s][k]: tasks covering key k of sequence s; parts_seen: each part written once.
    std::vector<std::vector<int32_t>> covered(static_cast<size_t>(n));
    for (int32_t s = 0; s < n; ++s) covered[static_cast<size_t>(s)].assign(tables[s].size(), 0);
    std::vector<int32_t> parts_seen(static_cast<size_t>(part_start[n]), 0);
    for (int32_t t = 0; t < plan.n_cascade_tasks; ++t) {
      const int32_t* task = tasks + t * kDecodeTaskFields;
      ASSERT_GE(task[kTaskMembers], 1);
      ASSERT_LE(task[kTaskMembers], opts.members);
      ASSERT_LT(task[kTaskKeyBegin], task[kTaskKeyEnd]);
      const auto& tt = tables[static_cast<size_t>(task[kTaskTableSeq])];
      for (int32_t m = 0; m < task[kTaskMembers]; ++m) {
        const int32_t s = members[2 * (task[kTaskMemberBegin] + m)];
        const int32_t part = members[2 * (task[kTaskMemberBegin] + m) + 1];
        const int32_t w = work_of[static_cast<size_t>(s)];
        ASSERT_GE(part, part_start[w]);
        ASSERT_LT(part, part_start[w + 1]);
        ++parts_seen[static_cast<size_t>(part)];
        const auto& own = tables[static_cast<size_t>(s)];
        ASSERT_LE(task[kTaskKeyEnd], static_cast<int32_t>(own.size()));
        if (task[kTaskMembers] > 1) {
          EXPECT_LT(task[kTaskKeyEnd], static_cast<int32_t>(own.size()));  // never the newest
        }
        for (int32_t k = task[kTaskKeyBegin]; k < task[kTaskKeyEnd]; ++k) {
          ASSERT_EQ(tt[static_cast<size_t>(k)], own[static_cast<size_t>(k)]) << "key " << k;
          ++covered[static_cast<size_t>(s)][static_cast<size_t>(k)];
        }
      }
    }
    for (int32_t s = 0; s < n; ++s) {
      for (int32_t c : covered[static_cast<size_t>(s)]) ASSERT_EQ(c, 1) << "sequence " << s;
    }
    for (int32_t c : parts_seen) ASSERT_EQ(c, 1);
  }
  EXPECT_GT(cascaded, 10);  // most rounds have a group sharing 256 keys or more
  // Off without members (the dtype has no cascade kernel), and below kCascadeMinDecode.
  StepBatch small = make_batch(kCascadeMinDecode - 1, 600, 0, false);
  EXPECT_EQ(plan_step(small.view(), config, true).cascade_max_tasks, 0);
}

// The memo changes nothing in the plan: steps over one table (as the worker's step ring lays it
// out: each sequence at a fixed table start), where sequences append keys, a prefix is rewritten
// in place, and a sequence leaves its table start to a new one, plan the same tasks with the memo
// as without it.
TEST(StepStaging, CascadeMemoPlansWhatAFreshComparisonPlans) {
  const ModelConfig config = preset_config("llama3.2-1b");
  const CascadeOptions opts{16, 132};
  constexpr int32_t kSeqs = 24;
  constexpr int32_t kRegion = 1200;  // table entries per sequence
  std::mt19937 rng(3);
  std::vector<int32_t> prefix(700);
  std::iota(prefix.begin(), prefix.end(), 0);
  int32_t next = 700;
  std::vector<std::vector<int32_t>> tables(kSeqs);
  auto fresh = [&](int32_t s) {
    tables[static_cast<size_t>(s)].assign(prefix.begin(),
                                          prefix.begin() + 300 + static_cast<int32_t>(rng() % 400));
    tables[static_cast<size_t>(s)].push_back(next++);
  };
  for (int32_t s = 0; s < kSeqs; ++s) fresh(s);
  std::vector<int32_t> table_memo(kSeqs * kRegion), table_plain(kSeqs * kRegion);
  CascadeMemo memo(table_memo.size());
  std::vector<int32_t> written(kSeqs, 0);  // entries of each table already in the runner's table
  int32_t cascaded = 0, rewritten = -1;
  for (int32_t step = 0; step < 60; ++step) {
    const int32_t event = static_cast<int32_t>(rng() % 4);
    const auto s = static_cast<int32_t>(rng() % kSeqs);
    auto& t = tables[static_cast<size_t>(s)];
    if (rewritten >= 0 || event == 0) {  // a new sequence takes a table start
      const int32_t q = rewritten >= 0 ? rewritten : s;
      fresh(q);
      written[static_cast<size_t>(q)] = 0;
      rewritten = -1;
    } else if (event == 1) {
      // An entry rewritten in place (the sequence resends its table). Below 256 keys it breaks
      // the group for this step; the next step gives the table start to a new sequence.
      t[rng() % (t.size() - 1)] = next++;
      written[static_cast<size_t>(s)] = 0;
      rewritten = s;
    }
    // The batch's own view, with the table entries as the ring brings them: each sequence at its
    // table start, only the entries the runner's table does not hold yet.
    StepBatch b;
    std::vector<int32_t> slot_start, new_slot_start{0}, new_slots;
    const std::vector<int32_t> one{5};
    for (int32_t q = 0; q < kSeqs; ++q) {
      auto& tq = tables[static_cast<size_t>(q)];
      if (static_cast<int32_t>(tq.size()) >= kRegion) {
        fresh(q);
        written[static_cast<size_t>(q)] = 0;
      }
      tq.push_back(next++);  // the decode token's slot
      b.add_sequence(one, tq, true, SamplingParams{}, 1);
      slot_start.push_back(q * kRegion);
      new_slots.insert(new_slots.end(), tq.begin() + written[static_cast<size_t>(q)], tq.end());
      new_slot_start.push_back(static_cast<int32_t>(new_slots.size()));
      written[static_cast<size_t>(q)] = static_cast<int32_t>(tq.size());
    }
    StepBatchView v = b.view();
    v.slot_start = slot_start;
    v.new_slot_start = new_slot_start;
    v.new_slots = new_slots;
    StepPlan with = plan_step(v, config, true), without = plan_step(v, config, true);
    std::vector<char> host_with(with.layout.total_bytes), host_without(without.layout.total_bytes);
    ASSERT_TRUE(
        fill_step(v, config, &with, next, true, table_memo.data(), host_with.data(), opts, &memo)
            .is_ok());
    ASSERT_TRUE(
        fill_step(v, config, &without, next, true, table_plain.data(), host_without.data(), opts)
            .is_ok());
    ASSERT_EQ(with.n_cascade_tasks, without.n_cascade_tasks) << "step " << step;
    EXPECT_EQ(host_with, host_without) << "step " << step;
    if (with.n_cascade_tasks > 0) ++cascaded;
  }
  EXPECT_GT(cascaded, 40);
}

}  // namespace
}  // namespace litellama
