#include "kernels/reference/embedding.h"

#include "kernels/reference/gather_rows.h"

namespace litellama::reference {

void embedding(float* out, const int32_t* token_ids, const float* table, int32_t n_tokens,
               int32_t hidden) {
  gather_rows(out, table, token_ids, n_tokens, hidden);
}

}  // namespace litellama::reference
