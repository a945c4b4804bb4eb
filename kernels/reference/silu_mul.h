// CPU reference of kernels/silu_mul: act = silu(gate) * up over rows [gate | up], float32.
#pragma once

#include <cstdint>

namespace litellama::reference {

void silu_mul(float* act,            // [n_tokens, inter]
              const float* gate_up,  // [n_tokens, 2 * inter]
              int32_t n_tokens, int32_t inter);

}  // namespace litellama::reference
