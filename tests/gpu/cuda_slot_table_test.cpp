// The CUDA runner's device-resident slot table: each sequence's table sent once to a place of its
// own, then one new entry per step (from pageable memory, or from registered memory that the
// device copies from directly, as the worker's step ring), decodes exactly as whole tables every
// step do, eagerly and through CUDA graphs.
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/random_checkpoint.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/worker/table_deltas.h"

namespace litellama {
namespace {

TEST(CudaSlotTable, DeltasFromPageableAndRegisteredMemoryMatchWholeTables) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("litellama_cuda_table_" + std::to_string(getpid())))
                              .string();
  auto preset = find_random_checkpoint_preset("llama3-tiny");
  LITELLAMA_ASSERT_OK(preset.status());
  RandomCheckpointOptions ckpt_options;
  ckpt_options.seed = 21;
  LITELLAMA_ASSERT_OK(write_random_checkpoint(dir, preset->config, ckpt_options));
  auto ckpt = Checkpoint::open(dir);
  LITELLAMA_ASSERT_OK(ckpt.status());
  RunnerOptions o;
  o.device = Device::kCuda;
  o.compute_dtype = DType::kBF16;
  o.n_kv_slots = 4096;
  o.max_batch_tokens = 512;
  o.max_batch_seqs = 16;
  auto make = [&] {
    auto r = create_model_runner(*ckpt, o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
  };
  auto whole_runner = make();
  auto delta_runner = make();
  auto registered_runner = make();
  ASSERT_TRUE(whole_runner && delta_runner && registered_runner);

  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 123, 900, 42}, {7, 8, 9, 10, 11, 12, 13, 14, 15}, {300, 200, 100}, {1, 2}};
  std::vector<int32_t> pool(4096);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(9));
  std::vector<std::vector<int32_t>> slots;
  for (size_t s = 0; s < prompts.size(); ++s) {
    slots.emplace_back(pool.begin() + static_cast<std::ptrdiff_t>(s * 64),
                       pool.begin() + static_cast<std::ptrdiff_t>(s * 64 + 64));
  }
  const int32_t n_steps = 20;
  const std::vector<int32_t> bases = {5000, 40, 9000, 700};
  const auto whole = test::decode_sequences(*whole_runner, prompts, slots, n_steps, false, {});
  const auto deltas = test::decode_sequences(*delta_runner, prompts, slots, n_steps, true, bases);
  const auto registered =
      test::decode_sequences(*registered_runner, prompts, slots, n_steps, true, bases, true);
  ASSERT_EQ(whole.ids.size(), prompts.size());
  ASSERT_EQ(whole.ids[0].size(), static_cast<size_t>(n_steps));
  EXPECT_EQ(deltas.ids, whole.ids);
  EXPECT_EQ(registered.ids, whole.ids);
  EXPECT_EQ(deltas.top, whole.top);
  EXPECT_EQ(registered.top, whole.top);
  // The decode steps ran through graphs too.
  EXPECT_GT(delta_runner->graph_replays(), 10);
  EXPECT_GT(registered_runner->graph_replays(), 10);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace litellama
