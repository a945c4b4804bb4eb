#include "kernels/reference/silu_mul.h"

#include <cmath>

namespace litellama::reference {

void silu_mul(float* act, const float* gate_up, int32_t n_tokens, int32_t inter) {
  for (int32_t t = 0; t < n_tokens; ++t) {
    const float* g = gate_up + static_cast<int64_t>(t) * 2 * inter;
    const float* u = g + inter;
    float* o = act + static_cast<int64_t>(t) * inter;
    for (int32_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace litellama::reference
