// How many bytes of device memory the CUDA runner gives its KV pool when no slot count is set.
// Host arithmetic only (unit-tested without a device: tests/gpu/kv_budget_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace litellama {

struct KvBudgetInputs {
  size_t free_before_load = 0;          // free device memory before this worker loaded anything
  size_t free_now = 0;                  // free device memory now (weights and workspaces allocated)
  size_t total = 0;                     // the device's memory
  double kv_memory_fraction = 0.85;     // RunnerOptions: share of free memory (no utilization)
  double gpu_memory_utilization = 0.0;  // RunnerOptions: 0 = unset
  int64_t reserve_bytes = 0;            // RunnerOptions::reserve_device_bytes
};

// Utilization taken when a reserve is given without --gpu-memory-utilization.
inline constexpr double kDefaultUtilizationWithReserve = 0.9;
// Left free under a utilization limit for what cuBLAS and graph captures allocate later.
inline constexpr size_t kKvBudgetMarginBytes = size_t{512} << 20;

// Without a utilization (and no reserve): kv_memory_fraction of what is free now. With one: a
// per-instance limit, as vLLM's: that share of the device's total memory for this worker's
// weights, workspaces and KV pool, whatever other processes on the device hold (a second
// server), less the reserve for the vision service (already started or not: the limit does not
// depend on what is free), and never more than is free now less kKvBudgetMarginBytes. So with a
// reserve the budget is the same whichever of the two processes started first, as long as the
// device holds both. kResourceExhausted (naming the figures) when nothing is left.
Result<double> kv_pool_budget_bytes(const KvBudgetInputs& in);

}  // namespace litellama
