#include "services/worker/cuda/kv_budget.h"

#include <algorithm>

namespace litellama {

Result<double> kv_pool_budget_bytes(const KvBudgetInputs& in) {
  const double free_now = static_cast<double>(in.free_now);
  const double reserve = static_cast<double>(std::max<int64_t>(in.reserve_bytes, 0));
  const double utilization = in.gpu_memory_utilization > 0.0 ? in.gpu_memory_utilization
                             : reserve > 0.0                 ? kDefaultUtilizationWithReserve
                                                             : 0.0;
  if (utilization <= 0.0) return free_now * in.kv_memory_fraction;
  const double own = std::max(0.0, static_cast<double>(in.free_before_load) - free_now);
  const double limit = static_cast<double>(in.total) * utilization - reserve;
  const double budget = std::min(limit - own, free_now - static_cast<double>(kKvBudgetMarginBytes));
  if (budget <= 0.0) {
    return make_error(StatusCode::kResourceExhausted,
                      "--gpu-memory-utilization {} leaves no memory for the KV pool: the limit is "
                      "{} bytes ({} reserved for another process), this worker's weights and "
                      "workspaces take {}, and {} of the device's {} bytes are free",
                      utilization, static_cast<size_t>(std::max(limit, 0.0)),
                      static_cast<size_t>(reserve), static_cast<size_t>(own), in.free_now,
                      in.total);
  }
  return budget;
}

}  // namespace litellama
