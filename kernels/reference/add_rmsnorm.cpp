#include "kernels/reference/add_rmsnorm.h"

#include <cmath>

namespace litellama::reference {

void add(float* residual, const float* delta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] += delta[i];
}

void rmsnorm(float* out, const float* x, const float* weight, int32_t n_rows, int32_t hidden,
             float eps) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* row = x + static_cast<int64_t>(r) * hidden;
    double sum_sq = 0.0;
    for (int32_t i = 0; i < hidden; ++i) sum_sq += static_cast<double>(row[i]) * row[i];
    const float inv_rms =
        static_cast<float>(1.0 / std::sqrt(sum_sq / hidden + static_cast<double>(eps)));
    float* o = out + static_cast<int64_t>(r) * hidden;
    for (int32_t i = 0; i < hidden; ++i) o[i] = row[i] * inv_rms * weight[i];
  }
}

}  // namespace litellama::reference
