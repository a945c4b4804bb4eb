// Embedding gather: the embedding table's rows named by the token ids, which is the row gather
// of gather_rows.cu over the table (one block per token, 16-byte copies when the row allows).
#include "kernels/embedding.h"

#include "kernels/gather_rows.h"

namespace litellama {

bool embedding_supports(DType dtype) {
  return gather_rows_supports(dtype);
}

Status launch_embedding(void* out, const int32_t* token_ids, const void* table, int32_t n_tokens,
                        int32_t hidden, DType dtype, KernelStream stream) {
  if (n_tokens == 0) return Status::ok();
  if (!embedding_supports(dtype)) {
    return make_error(StatusCode::kUnsupported, "embedding: unsupported dtype {}",
                      dtype_torch_name(dtype));
  }
  return launch_gather_rows(out, table, token_ids, n_tokens, hidden, dtype, stream);
}

}  // namespace litellama
