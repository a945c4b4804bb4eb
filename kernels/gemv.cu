// Small-batch GEMV (see gemv.h): the launchers, and the launch policy of the tensor-core kernel
// (gemv_impl.cuh), which tile configuration each shape gets. Portable builds run the SIMT kernel
// of gemv_portable.cuh behind the same launchers and the same gemv_supports().
//
// The policy follows bench/linear_bench.cu's sweep on an H200 (decode shapes of Llama-3.2-1B and
// Llama-3.1-8B, 1 and 8 rows, back to back in a CUDA graph with PDL): matrices with many 16-row
// tiles stream best with 8 warps per tile and 4 chunks in flight per warp; with few tiles (the
// grid then does not fill the GPU twice) 16 warps per tile do, reading 32 bytes of each row per
// lane and chunk when k is long. The paired epilogues (two tiles per block) take 8 warps, or the
// looping kernel with 16 warps where that streams faster (launch_paired).
#include "kernels/gemv.h"

#include "kernels/cuda_check.h"

#if !LITELLAMA_PORTABLE_KERNELS
#include "kernels/gemv_impl.cuh"
#else
#include "kernels/gemv_portable.cuh"
#endif

namespace litellama {
namespace {

// k of any shape: for the tensor-core kernel a multiple of its chunk of 2 vectors of 8 elements
// per lane, 4 lanes (the wider chunk of launch_paired applies only where k is a multiple of it);
// the portable kernel needs whole 16-byte vectors, and takes the same shapes.
constexpr int kAlignK = 64;

#if !LITELLAMA_PORTABLE_KERNELS
using gemv_detail::Epilogue;
using gemv_detail::kTileRows;
using gemv_detail::Params;
using gemv_detail::sm_count;

// k segments per unit for a matrix of long rows (k >= 4096) and no more 16-row tiles than
// multiprocessors (each of which then streams one tile alone): the segmented configuration <8
// warps, 16 bytes, 4 chunks> runs units of 16 / segs rows, several blocks per multiprocessor.
// Returns the segment count (2, 4 or 8) whose units put the fewest rows on the busiest
// multiprocessor, all blocks resident at once, where that is fewer than 16 rows (the fewest
// segments among equals); 1 otherwise. Needs m * segs <= 8 and k a multiple of segs chunks of 32
// elements. For example Qwen2.5-1.5B's down projection (1536 rows, 96 tiles on 132
// multiprocessors, k 8960) takes 4 at up to 2 rows: 384 units of 4 rows, at most 12 rows per
// multiprocessor. Rows shorter than kMinSegmentK keep whole tiles: each block's stream is then too
// short for the extra blocks to pay for themselves.
constexpr int32_t kMinSegmentK = 4096;

template <typename T, typename OutT, Epilogue E>
int pick_segments(const Params& p, int64_t sms) {
  if (p.k < kMinSegmentK) return 1;
  const int64_t per_sm = gemv_detail::unit_blocks_per_sm<T, OutT, 1, E, 8, 1, 4, false, 2>();
  int best = 1;
  int64_t best_rows = kTileRows;
  for (const int segs : {2, 4, 8}) {
    if (p.m * segs > kGemvMaxRows || p.k % (segs * 32) != 0) continue;
    const int64_t rows = kTileRows / segs;
    const int64_t units = ceil_div<int64_t>(p.n, rows);
    const int64_t blocks_on_busiest = ceil_div<int64_t>(units, sms);
    if (blocks_on_busiest > per_sm) continue;
    if (blocks_on_busiest * rows < best_rows) {
      best = segs;
      best_rows = blocks_on_busiest * rows;
    }
  }
  return best;
}

// The segments of launch_single: pick_segments where the tiles fit on the multiprocessors.
template <typename T, typename OutT, Epilogue E>
int single_segments(const Params& p) {
  const int64_t tiles = ceil_div<int64_t>(p.n, kTileRows);
  const int64_t sms = sm_count();
  return tiles <= sms ? pick_segments<T, OutT, E>(p, sms) : 1;
}

// One tile per block (kStore, kResidualAdd): the configuration by tile count and k.
template <typename T, typename OutT, Epilogue E>
cudaError_t launch_single(const Params& p, KernelStream stream) {
  using gemv_detail::launch;
  const int64_t tiles = ceil_div<int64_t>(p.n, kTileRows);
  const int64_t sms = sm_count();
  switch (single_segments<T, OutT, E>(p)) {
    case 2:
      return launch<T, OutT, 1, E, 8, 1, 4, false, false, 2>(p, stream);
    case 4:
      return launch<T, OutT, 1, E, 8, 1, 4, false, false, 4>(p, stream);
    case 8:
      return launch<T, OutT, 1, E, 8, 1, 4, false, false, 8>(p, stream);
    default:
      break;
  }
  if (tiles > 2 * sms) return launch<T, OutT, 1, E, 8, 1, 4>(p, stream);
  if (tiles > sms) {
    // One row at k up to 4096 (Llama-3.1-8B's o projection): 8 warps with 32-byte chunks, three
    // blocks of 80 registers per multiprocessor where the 16-warp blocks fit two. More rows, or
    // longer rows (the down projection, k 14336), stream better with 16 warps per tile.
    if (p.m == 1 && p.k <= 4096) return launch<T, OutT, 1, E, 8, 2, 2>(p, stream);
    return launch<T, OutT, 1, E, 16, 1, 2>(p, stream);
  }
  if (p.k > 4096) return launch<T, OutT, 1, E, 16, 2, 2>(p, stream);
  return launch<T, OutT, 1, E, 16, 1, 4>(p, stream);
}

// Two tiles per block (kSiluMul, kRope). The gate/up projection, and the QKV projection from 3
// rows, stream best with 16 warps and one chunk in flight, each block looping over units, where k
// is a whole number of the warps' chunks (so every warp's last chunk of a unit is its ring's last
// slot and the ring runs on into the next unit): chunks of 32 bytes of each row per lane where k
// is a multiple of 1024; for gate/up, 48 bytes where k is a multiple of 1536 (Qwen2.5-1.5B's
// hidden size). QKV at k >= 4096 and up to 2 rows (Llama-3.1-8B) takes one unit per block with 8
// warps, 32-byte chunks and 2 in flight, which edges out the looping kernel there. Otherwise 8
// warps, 16 bytes, 4 chunks, one unit per block.
//
// QKV of up to 4 rows whose tiles of 8 rotary pairs (one tile per block: rows j and head_dim / 2
// + j of a head as its rows g and g + 8) number no more than the multiprocessors, outside the
// looping case: at 3 and 4 rows those single tiles, twice the blocks of tile pairs, each on its
// own multiprocessor, with a ring of 8 chunks per warp (Qwen2.5-1.5B: 128 blocks where tile pairs
// made 64); at 1 and 2 rows the tile pairs again, but with 16 warps (72 registers, one block per
// multiprocessor), which are better there and worse at 3 and 4 rows. Where single tiles would put
// two blocks on some multiprocessors (Llama-3.2-1B: 192), or at 8 rows, they lose to tile pairs
// (the measurements are in the history of bench/RESULTS.md).
template <typename T, Epilogue E, bool kNorm = false>
cudaError_t launch_paired(const Params& p, KernelStream stream) {
  using gemv_detail::launch;
  if constexpr (E == Epilogue::kRope) {
    if (p.k >= 4096 && p.m <= 2) return launch<T, T, 2, E, 8, 2, 2, kNorm>(p, stream);
  }
  if (E == Epilogue::kSiluMul || p.m >= 3) {
    if (p.k % 1024 == 0) return launch<T, T, 2, E, 16, 2, 1, kNorm, /*kLoop=*/true>(p, stream);
    if constexpr (E == Epilogue::kSiluMul) {
      if (p.k % 1536 == 0) return launch<T, T, 2, E, 16, 3, 1, kNorm, /*kLoop=*/true>(p, stream);
    }
  }
  if constexpr (E == Epilogue::kRope) {
    if (p.m <= 4 && p.n / kTileRows <= sm_count()) {
      if (p.m <= 2) return launch<T, T, 2, E, 16, 1, 2, kNorm>(p, stream);
      return launch<T, T, 1, E, 8, 1, 8, kNorm>(p, stream);
    }
  }
  return launch<T, T, 2, E, 8, 1, 4, kNorm>(p, stream);
}

#else  // LITELLAMA_PORTABLE_KERNELS

// The portable kernel has one configuration: a unit of two rows per warp, no k segments.
using gemv_portable::Epilogue;
using gemv_portable::Params;

template <typename T, typename OutT, Epilogue E>
cudaError_t launch_single(const Params& p, KernelStream stream) {
  return gemv_portable::launch<T, OutT, E>(p, stream);
}

template <typename T, Epilogue E, bool kNorm = false>
cudaError_t launch_paired(const Params& p, KernelStream stream) {
  return gemv_portable::launch<T, T, E, kNorm>(p, stream);
}

template <typename T, typename OutT, Epilogue E>
int single_segments(const Params& /*p*/) {
  return 1;
}

#endif  // LITELLAMA_PORTABLE_KERNELS

Params make_params(const void* x, const void* w, void* y, int32_t m, int32_t n, int32_t k,
                   int32_t ldy) {
  Params p{};
  p.x = x;
  p.w = w;
  p.y = y;
  p.m = m;
  p.n = n;
  p.k = k;
  p.ldy = ldy;
  return p;
}

Status unsupported(const char* what, DType dtype, DType out_dtype, int32_t m, int32_t n,
                   int32_t k) {
  return make_error(StatusCode::kUnsupported, "{}: unsupported {} -> {} with m {} n {} k {}", what,
                    dtype_torch_name(dtype), dtype_torch_name(out_dtype), m, n, k);
}

}  // namespace

bool gemv_supports(DType dtype, DType out_dtype, int32_t m, int32_t k) {
  const bool half = dtype == DType::kBF16 || dtype == DType::kF16;
  return half && (out_dtype == dtype || out_dtype == DType::kF32) && m >= 1 && m <= kGemvMaxRows &&
         k > 0 && k % kAlignK == 0;
}

bool gemv_rope_supports(int32_t head_dim) {
#if !LITELLAMA_PORTABLE_KERNELS
  static_assert(64 % (2 * kTileRows) == 0, "a head's halves are whole tiles");
#endif
  return head_dim == 64 || head_dim == 128;
}

Status launch_gemv(void* y, const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                   DType dtype, DType out_dtype, KernelStream stream) {
  if (!gemv_supports(dtype, out_dtype, m, k) || n <= 0) {
    return unsupported("gemv", dtype, out_dtype, m, n, k);
  }
  const Params p = make_params(x, w, y, m, n, k, n);
  const bool f32_out = out_dtype == DType::kF32;
  cudaError_t err;
  if (dtype == DType::kBF16) {
    err = f32_out ? launch_single<gpu_bf16, float, Epilogue::kStore>(p, stream)
                  : launch_single<gpu_bf16, gpu_bf16, Epilogue::kStore>(p, stream);
  } else {
    err = f32_out ? launch_single<__half, float, Epilogue::kStore>(p, stream)
                  : launch_single<__half, __half, Epilogue::kStore>(p, stream);
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(err);
  return Status::ok();
}

Status launch_gemv_residual_add(void* residual, const void* x, const void* w, int32_t m, int32_t n,
                                int32_t k, DType dtype, KernelStream stream) {
  if (!gemv_supports(dtype, dtype, m, k) || n <= 0) {
    return unsupported("gemv_residual_add", dtype, dtype, m, n, k);
  }
  const Params p = make_params(x, w, residual, m, n, k, n);
  const cudaError_t err = dtype == DType::kBF16
                              ? launch_single<gpu_bf16, gpu_bf16, Epilogue::kResidualAdd>(p, stream)
                              : launch_single<__half, __half, Epilogue::kResidualAdd>(p, stream);
  LITELLAMA_CUDA_RETURN_IF_ERROR(err);
  return Status::ok();
}

int32_t gemv_residual_add_k_segments(DType dtype, int32_t m, int32_t n, int32_t k) {
  if (!gemv_supports(dtype, dtype, m, k) || n <= 0) return 0;
  const Params p = make_params(nullptr, nullptr, nullptr, m, n, k, n);
  return dtype == DType::kBF16 ? single_segments<gpu_bf16, gpu_bf16, Epilogue::kResidualAdd>(p)
                               : single_segments<__half, __half, Epilogue::kResidualAdd>(p);
}

Status launch_gemv_silu_mul(void* act, const void* x, const void* w_gate_up, int32_t m,
                            int32_t inter, int32_t k, DType dtype, KernelStream stream) {
  if (!gemv_supports(dtype, dtype, m, k) || inter <= 0) {
    return unsupported("gemv_silu_mul", dtype, dtype, m, inter, k);
  }
  const Params p = make_params(x, w_gate_up, act, m, 2 * inter, k, inter);
  const cudaError_t err = dtype == DType::kBF16
                              ? launch_paired<gpu_bf16, Epilogue::kSiluMul>(p, stream)
                              : launch_paired<__half, Epilogue::kSiluMul>(p, stream);
  LITELLAMA_CUDA_RETURN_IF_ERROR(err);
  return Status::ok();
}

Status launch_gemv_qkv_rope(const GemvRope& rope, const void* x, const void* w_qkv, int32_t m,
                            int32_t k, DType dtype, KernelStream stream,
                            std::optional<GemvRmsNorm> norm) {
  const int32_t n = (rope.n_heads + 2 * rope.n_kv_heads) * rope.head_dim;
  if (!gemv_supports(dtype, dtype, m, k) || !gemv_rope_supports(rope.head_dim) ||
      rope.n_heads <= 0 || rope.n_kv_heads <= 0) {
    return unsupported("gemv_qkv_rope", dtype, dtype, m, n, k);
  }
  Params p = make_params(x, w_qkv, nullptr, m, n, k, 0);
  p.rope = rope;
  const bool bf16 = dtype == DType::kBF16;
  cudaError_t err;
  if (norm) {
    p.norm_eps = norm->eps;
    err = bf16 ? launch_paired<gpu_bf16, Epilogue::kRope, true>(p, stream)
               : launch_paired<__half, Epilogue::kRope, true>(p, stream);
  } else {
    err = bf16 ? launch_paired<gpu_bf16, Epilogue::kRope>(p, stream)
               : launch_paired<__half, Epilogue::kRope>(p, stream);
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(err);
  return Status::ok();
}

}  // namespace litellama
