// Row gather: out[i] = in[rows[i]]. Picks the last token of each sampled sequence out of the
// packed step, so the final norm and the lm_head GEMM run on those rows only (logits for sampled
// sequences alone).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"
#include "kernels/kernel_stream.h"

namespace litellama {

bool gather_rows_supports(DType dtype);

// rows[i] must be in [0, n_rows_in); the caller builds them on the host.
Status launch_gather_rows(void* out,            // [n_rows_out, cols]
                          const void* in,       // [n_rows_in, cols]
                          const int32_t* rows,  // [n_rows_out]
                          int32_t n_rows_out, int32_t cols, DType dtype, KernelStream stream);

// Row scatter from float32: out[rows[i]] = in[src_rows ? src_rows[i] : i] rounded to dtype, for
// i < n_rows (input embeddings such as LLaVA's image features replacing the embedding lookup of
// some tokens; `in` is read in place, e.g. from a pool another process exports, whose rows
// src_rows names). rows[i] and src_rows[i] must be in range.
Status launch_scatter_rows_f32(void* out,                // [*, cols] of dtype
                               const float* in,          // [*, cols]
                               const int32_t* rows,      // [n_rows]
                               const int32_t* src_rows,  // [n_rows] or null
                               int32_t n_rows, int32_t cols, DType dtype, KernelStream stream);

// The slot-table write of a step (StepBatchView's contract): for each sequence s < n_seqs, the
// n_w = new_slot_start[s+1] - new_slot_start[s] entries new_slots[new_slot_start[s] ..] go to
// table[slot_start[s] + kv_len[s] - n_w ..]. All arrays are on the device; the caller has checked
// the ranges on the host.
Status launch_write_slot_table(int32_t* table, const int32_t* slot_start, const int32_t* kv_len,
                               const int32_t* new_slot_start, const int32_t* new_slots,
                               int32_t n_seqs, KernelStream stream);

}  // namespace litellama
