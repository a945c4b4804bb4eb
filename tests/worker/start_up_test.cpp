// Start-up: progress reports (LoadProgress), the checkpoint's per-shard sizes and read observer
// that feed them, and the CPU backend's default KV pool (a few contexts, mapped on first use).
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "common/load_progress.h"
#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "tests/worker/test_util.h"

namespace litellama {
namespace {

TEST(LoadProgressTest, ReportsEachTenthOnceAndAFinalLine) {
  std::vector<std::string> lines;
  {
    LoadProgress p(
        "weights", 1000, 2, [&](const std::string& l) { lines.push_back(l); },
        /*terminal=*/false);
    for (int i = 0; i < 100; ++i) p.add(10, i < 50 ? 0 : 1);
    EXPECT_EQ(p.done_bytes(), 1000);
    p.shard_done(0);
    p.shard_done(1);
    EXPECT_EQ(p.n_shards_done(), 2);
    p.add(5, 1);  // more than the total is clamped
    EXPECT_EQ(p.done_bytes(), 1000);
  }  // the destructor finishes
  // 0% at the start, 10% .. 100%, one line per finished shard (sharded), the final line.
  ASSERT_EQ(lines.size(), 1u + 10u + 2u + 1u);
  EXPECT_NE(lines[0].find("0% (0 B of 1000 B, shard 1 of 2)"), std::string::npos) << lines[0];
  EXPECT_NE(lines[5].find(" 50% (500 B of 1000 B"), std::string::npos) << lines[5];
  EXPECT_NE(lines[10].find("100% (1000 B of 1000 B"), std::string::npos) << lines[10];
  EXPECT_EQ(lines.back().rfind("weights: 1000 B from 2 shards in ", 0), 0u) << lines.back();
}

TEST(LoadProgressTest, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(int64_t{3} << 19), "1.5 MiB");
  EXPECT_EQ(format_bytes(int64_t{5} << 30), "5.0 GiB");
}

TEST(CheckpointProgressTest, ShardBytesAndReadObserverCoverEveryTensor) {
  test::TempDir tmp;
  test::make_model(tmp.path(), "llama3-tiny", 3, /*n_shards=*/3);
  auto ckpt = Checkpoint::open(tmp.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const std::vector<int64_t> shards = ckpt->shard_bytes();
  ASSERT_EQ(shards.size(), 3u);
  for (int64_t b : shards) EXPECT_GT(b, 0);
  EXPECT_EQ(std::accumulate(shards.begin(), shards.end(), int64_t{0}),
            static_cast<int64_t>(ckpt->size_bytes()));

  std::vector<int64_t> seen(3, 0);
  std::set<std::string> names;
  ckpt->set_read_observer([&](const TensorView& t) {
    ASSERT_GE(t.shard, 0);
    ASSERT_LT(t.shard, 3);
    if (names.insert(t.name).second) seen[static_cast<size_t>(t.shard)] += t.size_bytes;
  });
  RunnerOptions options;
  options.n_kv_slots = 64;
  options.n_threads = 1;
  auto runner = create_model_runner(*ckpt, options);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  // The CPU backend takes every tensor of the checkpoint: the progress reaches 100% per shard.
  EXPECT_EQ(seen, shards);
  ckpt->set_read_observer(nullptr);
  EXPECT_TRUE(ckpt->tensor(ckpt->embed_name()).is_ok());
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(CpuKvPoolTest, DefaultHoldsFourContextsWithinTheBudgetAndIsMappedLazily) {
  test::TempDir tmp;
  auto ckpt = test::open_new_model(tmp.path(), "llama3-tiny");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const ModelConfig& c = ckpt->config();
  const int64_t per_slot = int64_t{2} * c.n_layers * c.n_kv_heads * c.head_dim * 4;

  RunnerOptions options;
  options.n_threads = 1;
  options.max_batch_tokens = 512;
  options.kv_memory_bytes = 8 * c.max_position_embeddings * per_slot;  // room for more
  auto runner = create_model_runner(*ckpt, options);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  EXPECT_EQ((*runner)->n_kv_slots(), 4 * c.max_position_embeddings);

  // A budget below four contexts caps the pool.
  options.kv_memory_bytes = 1000 * per_slot;
  runner = create_model_runner(*ckpt, options);
  ASSERT_TRUE(runner.is_ok());
  EXPECT_EQ((*runner)->n_kv_slots(), 1000);

  // A 4 GiB pool costs (almost) no resident memory until slots are written.
  options.n_kv_slots = static_cast<int32_t>((int64_t{4} << 30) / per_slot);
  const int64_t before = resident_bytes();
  runner = create_model_runner(*ckpt, options);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  EXPECT_EQ((*runner)->n_kv_slots(), options.n_kv_slots);
  EXPECT_LT(resident_bytes() - before, int64_t{256} << 20);
}

}  // namespace
}  // namespace litellama
