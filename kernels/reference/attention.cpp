// Straightforward two-pass softmax per (token, head) in double: scores, max, exp-sum, weighted sum.
#include "kernels/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace litellama {

namespace {

Status validate(std::span<const int32_t> token_start, std::span<const int32_t> kv_len,
                std::span<const int32_t> slot_start, std::span<const int32_t> slot_table,
                std::span<const int32_t> seq_ids, int32_t n_slots, int32_t n_heads,
                int32_t n_kv_heads, int32_t head_dim) {
  if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "attention_reference: bad heads {}/{} or head_dim {}", n_heads, n_kv_heads,
                      head_dim);
  }
  const size_t n_seqs = kv_len.size();
  if (token_start.size() != n_seqs + 1 || slot_start.size() != n_seqs + 1) {
    return make_error(StatusCode::kInvalidArgument,
                      "attention_reference: token_start/slot_start must have n_seqs + 1 entries");
  }
  for (const int32_t s : seq_ids) {
    if (s < 0 || static_cast<size_t>(s) >= n_seqs) {
      return make_error(StatusCode::kInvalidArgument, "attention_reference: seq id {} out of range",
                        s);
    }
    const int32_t n_new = token_start[s + 1] - token_start[s];
    if (n_new < 1 || n_new > kv_len[s] || token_start[s] < 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "attention_reference: sequence {} has {} new tokens and kv_len {}", s,
                        n_new, kv_len[s]);
    }
    if (slot_start[s] < 0 || slot_start[s + 1] - slot_start[s] < kv_len[s] ||
        static_cast<size_t>(slot_start[s + 1]) > slot_table.size()) {
      return make_error(StatusCode::kInvalidArgument,
                        "attention_reference: slot table of sequence {} too short", s);
    }
    for (int32_t p = 0; p < kv_len[s]; ++p) {
      const int32_t slot = slot_table[slot_start[s] + p];
      if (slot < 0 || slot >= n_slots) {
        return make_error(StatusCode::kInvalidArgument,
                          "attention_reference: slot {} of sequence {} out of range", slot, s);
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status attention_reference(float* out, const float* q, const float* k_pool, const float* v_pool,
                           std::span<const int32_t> token_start, std::span<const int32_t> kv_len,
                           std::span<const int32_t> slot_start, std::span<const int32_t> slot_table,
                           std::span<const int32_t> seq_ids, int32_t n_slots, int32_t n_heads,
                           int32_t n_kv_heads, int32_t head_dim, float scale) {
  LITELLAMA_RETURN_IF_ERROR(validate(token_start, kv_len, slot_start, slot_table, seq_ids, n_slots,
                                     n_heads, n_kv_heads, head_dim));
  const int32_t group = n_heads / n_kv_heads;
  std::vector<double> scores;
  std::vector<double> acc(head_dim);
  for (const int32_t s : seq_ids) {
    const int32_t n_new = token_start[s + 1] - token_start[s];
    const int32_t pos0 = kv_len[s] - n_new;
    const int32_t* slots = slot_table.data() + slot_start[s];
    for (int32_t t = 0; t < n_new; ++t) {
      const int64_t token = token_start[s] + t;
      const int32_t n_keys = pos0 + t + 1;  // causal: positions 0..pos0 + t
      scores.resize(n_keys);
      for (int32_t h = 0; h < n_heads; ++h) {
        const int32_t kvh = h / group;
        const float* qh = q + (token * n_heads + h) * head_dim;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int32_t p = 0; p < n_keys; ++p) {
          const float* kp = k_pool + (static_cast<int64_t>(slots[p]) * n_kv_heads + kvh) * head_dim;
          double dot = 0.0;
          for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * kp[d];
          scores[p] = dot * scale;
          max_score = std::max(max_score, scores[p]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int32_t p = 0; p < n_keys; ++p) {
          const double w = std::exp(scores[p] - max_score);
          sum += w;
          const float* vp = v_pool + (static_cast<int64_t>(slots[p]) * n_kv_heads + kvh) * head_dim;
          for (int32_t d = 0; d < head_dim; ++d) acc[d] += w * vp[d];
        }
        float* oh = out + (token * n_heads + h) * head_dim;
        for (int32_t d = 0; d < head_dim; ++d) oh[d] = static_cast<float>(acc[d] / sum);
      }
    }
  }
  return Status::ok();
}

}  // namespace litellama
