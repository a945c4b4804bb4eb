#include "kernels/reference/embedding.h"

#include <algorithm>

namespace litellama::reference {

void embedding(float* out, const int32_t* token_ids, const float* table, int32_t n_tokens,
               int32_t hidden) {
  for (int32_t t = 0; t < n_tokens; ++t) {
    const float* src = table + static_cast<int64_t>(token_ids[t]) * hidden;
    std::copy(src, src + hidden, out + static_cast<int64_t>(t) * hidden);
  }
}

}  // namespace litellama::reference
