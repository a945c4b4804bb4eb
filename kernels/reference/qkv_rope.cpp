#include "kernels/reference/qkv_rope.h"

#include <algorithm>
#include <cmath>

#include "kernels/reference/add_rmsnorm.h"

namespace litellama::reference {

void rmsnorm_per_head(float* x, const float* weight, int32_t n_rows, int32_t n_heads,
                      int32_t head_dim, float eps) {
  rmsnorm(x, x, weight, n_rows * n_heads, head_dim, eps);
}

void rope(float* x, const int32_t* positions, const float* inv_freq, int32_t n_rows,
          int32_t n_heads, int32_t head_dim, float attention_scaling) {
  const int32_t half = head_dim / 2;
  for (int32_t r = 0; r < n_rows; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int32_t h = 0; h < n_heads; ++h) {
      float* head = x + (static_cast<int64_t>(r) * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[static_cast<int64_t>(r) * half + i];
        const float c = std::cos(angle) * attention_scaling;
        const float s = std::sin(angle) * attention_scaling;
        const float x0 = head[i], x1 = head[i + half];
        head[i] = x0 * c - x1 * s;
        head[i + half] = x1 * c + x0 * s;
      }
    }
  }
}

void store_slots(float* pool, const float* x, const int32_t* slots, int32_t n_rows,
                 int64_t row_elems) {
  for (int32_t t = 0; t < n_rows; ++t) {
    std::copy(x + t * row_elems, x + (t + 1) * row_elems, pool + slots[t] * row_elems);
  }
}

}  // namespace litellama::reference
