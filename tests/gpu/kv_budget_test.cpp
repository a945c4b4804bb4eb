// The CUDA runner's KV budget (services/worker/cuda/kv_budget.h): host arithmetic, no device.
#include <gtest/gtest.h>

#include "services/worker/cuda/kv_budget.h"

namespace litellama {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// A worker whose weights and workspaces take `own` on an 80 GiB device where another process
// (the vision service) holds `other` before the worker loads, or `other_after` only after.
KvBudgetInputs worker(size_t other_before, size_t own, int64_t reserve, double utilization) {
  KvBudgetInputs in;
  in.total = 80 * kGiB;
  in.free_before_load = in.total - other_before;
  in.free_now = in.free_before_load - own;
  in.reserve_bytes = reserve;
  in.gpu_memory_utilization = utilization;
  return in;
}

TEST(KvBudget, AReserveGivesTheSameBudgetWhicheverProcessStartedFirst) {
  const int64_t reserve = static_cast<int64_t>(20 * kGiB);
  // The vision service (15 GiB, within its 20 GiB reserve) started before the worker, or not yet.
  auto vision_first = kv_pool_budget_bytes(worker(15 * kGiB, 2 * kGiB, reserve, 0.0));
  auto worker_first = kv_pool_budget_bytes(worker(0, 2 * kGiB, reserve, 0.0));
  ASSERT_TRUE(vision_first.is_ok() && worker_first.is_ok());
  EXPECT_EQ(*vision_first, *worker_first);
  // 0.9 of 80 GiB, less the reserve, less the worker's own 2 GiB.
  EXPECT_DOUBLE_EQ(*worker_first, 0.9 * 80 * kGiB - 20.0 * kGiB - 2.0 * kGiB);
  // The vision service's 15 GiB fit beside the worker's 72 - 20 GiB: the device holds both.
  EXPECT_LE(*worker_first + 2.0 * kGiB + 15.0 * kGiB, 80.0 * kGiB);
}

TEST(KvBudget, WithoutAUtilizationItIsAShareOfWhatIsFree) {
  KvBudgetInputs in = worker(10 * kGiB, 2 * kGiB, 0, 0.0);
  in.kv_memory_fraction = 0.5;
  auto budget = kv_pool_budget_bytes(in);
  ASSERT_TRUE(budget.is_ok());
  EXPECT_DOUBLE_EQ(*budget, 0.5 * 68.0 * kGiB);
}

TEST(KvBudget, NeverMoreThanIsFreeLessTheMarginAndNothingLeftIsAnError) {
  // Another server holds 60 GiB: the 0.9 limit would allow more than is free.
  auto crowded = kv_pool_budget_bytes(worker(60 * kGiB, 2 * kGiB, 0, 0.9));
  ASSERT_TRUE(crowded.is_ok());
  EXPECT_DOUBLE_EQ(*crowded, 18.0 * kGiB - static_cast<double>(kKvBudgetMarginBytes));
  // A reserve larger than the limit leaves nothing: refused, naming the reserve.
  auto none = kv_pool_budget_bytes(worker(0, 2 * kGiB, static_cast<int64_t>(75 * kGiB), 0.9));
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("reserved for another process"), std::string::npos);
}

}  // namespace
}  // namespace litellama
