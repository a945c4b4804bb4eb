#include "kernels/reference/gather_rows.h"

#include <algorithm>

namespace litellama::reference {

void gather_rows(float* out, const float* in, const int32_t* rows, int32_t n_rows_out,
                 int32_t cols) {
  for (int32_t i = 0; i < n_rows_out; ++i) {
    const float* src = in + static_cast<int64_t>(rows[i]) * cols;
    std::copy(src, src + cols, out + static_cast<int64_t>(i) * cols);
  }
}

}  // namespace litellama::reference
