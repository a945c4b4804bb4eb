// CPU references of the two ops kernels/add_rmsnorm fuses: the residual add and RMSNorm, float32
// with double accumulation of the sum of squares.
#pragma once

#include <cstdint>

namespace litellama::reference {

// residual += delta
void add(float* residual,     // [n] in/out
         const float* delta,  // [n]
         int64_t n);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight
void rmsnorm(float* out,           // [n_rows, hidden]
             const float* x,       // [n_rows, hidden]
             const float* weight,  // [hidden]
             int32_t n_rows, int32_t hidden, float eps);

}  // namespace litellama::reference
