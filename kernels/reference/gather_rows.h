// CPU reference of kernels/gather_rows: out[i] = in[rows[i]], float32.
#pragma once

#include <cstdint>

namespace litellama::reference {

void gather_rows(float* out,           // [n_rows_out, cols]
                 const float* in,      // [n_rows_in, cols]
                 const int32_t* rows,  // [n_rows_out]
                 int32_t n_rows_out, int32_t cols);

}  // namespace litellama::reference
