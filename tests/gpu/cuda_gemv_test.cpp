// The small-batch GEMV variants (kernels/gemv.h) against a double-precision reference on shapes
// that take every configuration of the tensor-core kernel's launch policy (portable builds run
// the same tests on their SIMT kernel, gemv_portable.cuh), the
// fused SiLU * up epilogue against the unfused reference, the residual-add and QKV RoPE variants
// against the unfused kernels they replace, the RMSNorm folded into the QKV variant against
// add_rmsnorm then the GEMV, and programmatic dependent launch
// (kernels/launch.h): a chain of dependent kernels gives bit-identical results with and without
// it, launched directly and replayed from a CUDA graph, and so does decode attention, which loads
// K/V before its wait, right after the kernel that writes the newest key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/add_rmsnorm.h"
#include "kernels/attention_decode.h"
#include "kernels/block_trace.h"
#include "kernels/gemv.h"
#include "kernels/gpu_runtime.h"
#include "kernels/launch.h"
#include "kernels/qkv_rope.h"
#include "kernels/reference/silu_mul.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

// The GPU tests' shared helpers (device buffers, random tensors, tolerances).
using namespace gpu_test;  // NOLINT(google-build-using-namespace)

constexpr DType kHalfDtypes[] = {DType::kBF16, DType::kF16};

struct Shape {
  int32_t n, k;
};

// x @ w^T in double: [m, n].
std::vector<double> reference_gemm(const Tensor& x, const Tensor& w, int32_t m, int32_t n,
                                   int32_t k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int32_t kk = 0; kk < k; ++kk) {
        acc += static_cast<double>(x.values[static_cast<size_t>(i) * k + kk]) *
               w.values[static_cast<size_t>(j) * k + kk];
      }
      y[static_cast<size_t>(i) * n + j] = acc;
    }
  }
  return y;
}

// Rounds each value to `dtype` (what the kernel stores).
std::vector<float> round_to(const std::vector<double>& v, DType dtype) {
  std::vector<float> f(v.begin(), v.end());
  std::vector<uint8_t> bytes(f.size() * dtype_size_bytes(dtype));
  convert_from_f32(bytes.data(), dtype, f.data(), f.size());
  convert_to_f32(f.data(), bytes.data(), dtype, f.size());
  return f;
}

TEST(CudaGemv, MatchesDoubleReference) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(31);
  // Tile-aligned and ragged row counts (n % 16 != 0), one and many k chunks per warp, and every
  // configuration of the launch policy: many tiles (4500 rows), between one and two per
  // multiprocessor with short (3072 x 512) and long (2200 x 4160) k, few tiles with short (2048)
  // and long (8960) k, and many waves of blocks (the two largest). Fewer tiles than
  // multiprocessors with long rows cut k into segments at up to 4 rows: 130 x 8960 takes 8 (m 1),
  // 4 (m 2) and 2 (m 3, 4).
  const Shape shapes[] = {{16, 64},    {200, 192},   {37, 2112},  {2048, 2048},  {130, 8960},
                          {3072, 512}, {2200, 4160}, {4500, 320}, {20000, 1024}, {12007, 320}};
  for (DType dtype : kHalfDtypes) {
    for (DType out_dtype : {dtype, DType::kF32}) {
      for (Shape s : shapes) {
        for (int32_t m = 1; m <= kGemvMaxRows; ++m) {
          SCOPED_TRACE(testing::Message()
                       << gpu_test::dtype_label(dtype) << " -> " << gpu_test::dtype_label(out_dtype)
                       << " m " << m << " n " << s.n << " k " << s.k);
          ASSERT_TRUE(gemv_supports(dtype, out_dtype, m, s.k));
          const float amp = 1.0f / std::sqrt(static_cast<float>(s.k));
          const Tensor x = random_tensor(static_cast<size_t>(m) * s.k, dtype, -1, 1, rng);
          const Tensor w = random_tensor(static_cast<size_t>(s.n) * s.k, dtype, -amp, amp, rng);
          DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes);
          // One row more than m, poisoned: the kernel must not write past row m - 1.
          const size_t numel = static_cast<size_t>(m) * s.n;
          DevBuf d_y((numel + s.n) * dtype_size_bytes(out_dtype));
          LITELLAMA_ASSERT_OK(
              launch_gemv(d_y.get(), d_x.get(), d_w.get(), m, s.n, s.k, dtype, out_dtype, nullptr));
          LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
          const auto y = download_as_f32(d_y, numel + s.n, out_dtype);
          const auto ref = reference_gemm(x, w, m, s.n, s.k);
          // float32 accumulation of O(1) terms: 1e-5 absolute; a 16-bit output adds its rounding.
          const double tol = out_dtype == DType::kF32 ? 1e-5 : gpu_test::tolerance(out_dtype) / 2;
          size_t bad = 0;
          double worst = 0;
          for (size_t i = 0; i < numel; ++i) {
            const double err = std::fabs(y[i] - ref[i]) / std::max(1.0, std::fabs(ref[i]));
            worst = std::max(worst, std::isfinite(y[i]) ? err : INFINITY);
            bad += std::isfinite(y[i]) && err <= tol ? 0 : 1;
          }
          EXPECT_EQ(bad, 0u) << "worst relative error " << worst << " (tol " << tol << ")";
          size_t written_past = 0;
          for (size_t i = numel; i < numel + s.n; ++i) written_past += std::isnan(y[i]) ? 0 : 1;
          EXPECT_EQ(written_past, 0u);
        }
      }
    }
  }
}

TEST(CudaGemv, SiluMulMatchesGateUpThenSiluMul) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(32);
  for (DType dtype : kHalfDtypes) {
    // 8192 x 2048 and 8960 x 1536 take the looping kernel (k a multiple of 1024, with chunks of
    // 32 bytes per lane and row; of 1536, with 48): each block takes several tile pairs in turn,
    // its ring of loads running on into the next pair. 90 x 1536: the 48-byte chunks, one pair per
    // block, the last pair past n. 9000 x 320: many waves of one pair per block.
    for (Shape s : {Shape{64, 64}, Shape{200, 256}, Shape{8192, 2048}, Shape{8960, 1536},
                    Shape{90, 1536}, Shape{9000, 320}}) {
      const int32_t inter = s.n;
      for (int32_t m : {1, 3, 8}) {
        SCOPED_TRACE(testing::Message() << gpu_test::dtype_label(dtype) << " m " << m << " inter "
                                        << inter << " k " << s.k);
        // Gate/up values of a few units, where SiLU is far from linear.
        const float amp = 4.0f / std::sqrt(static_cast<float>(s.k));
        const Tensor x = random_tensor(static_cast<size_t>(m) * s.k, dtype, -1, 1, rng);
        const Tensor w = random_tensor(static_cast<size_t>(2 * inter) * s.k, dtype, -amp, amp, rng);
        DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes);
        const size_t numel = static_cast<size_t>(m) * inter;
        DevBuf d_act(numel * dtype_size_bytes(dtype));
        LITELLAMA_ASSERT_OK(
            launch_gemv_silu_mul(d_act.get(), d_x.get(), d_w.get(), m, inter, s.k, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        const auto act = download_as_f32(d_act, numel, dtype);
        // The unfused path: gate_up stored in dtype, then SiLU(gate) * up.
        const std::vector<float> gate_up = round_to(reference_gemm(x, w, m, 2 * inter, s.k), dtype);
        std::vector<float> ref(numel);
        reference::silu_mul(ref.data(), gate_up.data(), m, inter);
        // One unit of the stored gate/up may round the other way (float32 vs double sums).
        EXPECT_TRUE(gpu_test::all_close(act, ref, dtype, 2.0));
      }
    }
  }
}

// residual += round(x @ w^T): bit-identical to the plain GEMV (same shape, same sums) followed
// by add_rmsnorm's residual update.
TEST(CudaGemv, ResidualAddMatchesGemvThenAdd) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(35);
  for (DType dtype : kHalfDtypes) {
    // 1536 x 8960 (Qwen2.5-1.5B's down) cuts k into 4 segments at m 1; 4096 x 4096 is
    // Llama-3.1-8B's o projection.
    for (Shape s : {Shape{2048, 2048}, Shape{2048, 8192}, Shape{4500, 320}, Shape{96, 1536},
                    Shape{1536, 8960}, Shape{20000, 1024}, Shape{4096, 4096}}) {
      for (int32_t m : {1, 4, 8}) {
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " m " << m << " n " << s.n << " k " << s.k);
        const float amp = 1.0f / std::sqrt(static_cast<float>(s.k));
        const Tensor x = random_tensor(static_cast<size_t>(m) * s.k, dtype, -1, 1, rng);
        const Tensor w = random_tensor(static_cast<size_t>(s.n) * s.k, dtype, -amp, amp, rng);
        const Tensor residual = random_tensor(static_cast<size_t>(m) * s.n, dtype, -4, 4, rng);
        const std::vector<float> ones(static_cast<size_t>(s.n), 1.0f);
        DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes), d_ones = upload(ones);
        DevBuf d_want = upload(residual.bytes), d_got = upload(residual.bytes);
        DevBuf d_delta(residual.bytes.size()), d_normed(residual.bytes.size());
        LITELLAMA_ASSERT_OK(
            launch_gemv(d_delta.get(), d_x.get(), d_w.get(), m, s.n, s.k, dtype, dtype, nullptr));
        LITELLAMA_ASSERT_OK(launch_add_rmsnorm(d_normed.get(), d_want.get(), d_delta.get(),
                                               d_ones.as<float>(), m, s.n, 1e-5f, dtype, nullptr));
        LITELLAMA_ASSERT_OK(launch_gemv_residual_add(d_got.get(), d_x.get(), d_w.get(), m, s.n, s.k,
                                                     dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(download<uint16_t>(d_got, residual.bytes.size() / 2),
                  download<uint16_t>(d_want, residual.bytes.size() / 2));
      }
    }
  }
}

// The RoPE epilogue of a QKV GEMV writing q, k and v from the tests' device buffers.
GemvRope rope_into(DevBuf& q, DevBuf& k, DevBuf& v, const float* bias, const DevBuf& inv_freq,
                   const DevBuf& positions, const DevBuf& slots, const int32_t* freq_row,
                   int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scaling) {
  return GemvRope{q.get(),
                  k.get(),
                  v.get(),
                  bias,
                  inv_freq.as<float>(),
                  positions.as<int32_t>(),
                  slots.as<int32_t>(),
                  freq_row,
                  n_heads,
                  n_kv_heads,
                  head_dim,
                  scaling};
}

// The QKV projection with the RoPE epilogue against the plain GEMV then qkv_rope: Q and the
// written K/V slots agree within the dtype's tolerance (the two GEMVs tile differently), and no
// other slot is written.
TEST(CudaGemv, QkvRopeMatchesGemvThenQkvRope) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(36);
  struct Case {
    int32_t n_heads, n_kv_heads, head_dim, k;
    bool bias, freq_rows;
  };
  // The fourth case takes the looping kernel from 3 rows (k 1024) with more head halves than
  // resident blocks, so blocks take several in turn. On a GPU with at least 128 multiprocessors
  // the second and third take two tiles of 16 rows per block with 16 warps at 1 row and one tile
  // of 8 rotary pairs per block at 3 rows (the first has 192 such tiles and keeps two tiles of 16
  // rows per block of 8 warps, as all do at 8 rows). The last (k
  // 4096, Llama-3.1-8B's) takes 32-byte chunks, one unit per block at 1 row and the looping
  // kernel from 3.
  const Case cases[] = {{32, 8, 64, 2048, false, false},
                        {12, 2, 128, 1536, true, false},
                        {4, 4, 64, 256, true, true},
                        {256, 64, 64, 1024, false, false},
                        {8, 2, 128, 4096, true, false}};
  constexpr int32_t kSlots = 64;
  for (DType dtype : kHalfDtypes) {
    for (const Case& c : cases) {
      for (int32_t m : {1, 3, 8}) {
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " m " << m << " heads " << c.n_heads << "/"
                     << c.n_kv_heads << " head_dim " << c.head_dim);
        ASSERT_TRUE(gemv_rope_supports(c.head_dim));
        const int32_t n_total = c.n_heads + 2 * c.n_kv_heads;
        const int32_t n = n_total * c.head_dim;
        const int32_t half = c.head_dim / 2;
        const float amp = 1.0f / std::sqrt(static_cast<float>(c.k));
        const Tensor x = random_tensor(static_cast<size_t>(m) * c.k, dtype, -1, 1, rng);
        const Tensor w = random_tensor(static_cast<size_t>(n) * c.k, dtype, -amp, amp, rng);
        const std::vector<float> bias = random_floats(static_cast<size_t>(n), -0.5f, 0.5f, rng);
        const int32_t n_freq_rows = c.freq_rows ? 2 : 1;
        std::vector<float> inv_freq(static_cast<size_t>(n_freq_rows * half));
        for (size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] = std::pow(10000.0f, -static_cast<float>(i % half) / half) *
                        (i >= static_cast<size_t>(half) ? 0.25f : 1.0f);
        }
        std::vector<int32_t> positions, slots, freq_row;
        for (int32_t t = 0; t < m; ++t) {
          positions.push_back(17 * t + 3);
          slots.push_back((t * 37 + 5) % kSlots);
          freq_row.push_back(t % n_freq_rows);
        }
        DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes), d_bias = upload(bias);
        DevBuf d_freq = upload(inv_freq), d_pos = upload(positions), d_slots = upload(slots);
        DevBuf d_freq_row = upload(freq_row);
        const size_t e = dtype_size_bytes(dtype);
        const size_t q_numel = static_cast<size_t>(m) * c.n_heads * c.head_dim;
        const size_t pool_numel = static_cast<size_t>(kSlots) * c.n_kv_heads * c.head_dim;
        DevBuf d_qkv(static_cast<size_t>(m) * n * e);
        DevBuf want_q(q_numel * e), want_k(pool_numel * e), want_v(pool_numel * e);
        DevBuf got_q(q_numel * e), got_k(pool_numel * e), got_v(pool_numel * e);
        const float* bias_ptr = c.bias ? d_bias.as<float>() : nullptr;
        const int32_t* freq_row_ptr = c.freq_rows ? d_freq_row.as<int32_t>() : nullptr;
        LITELLAMA_ASSERT_OK(
            launch_gemv(d_qkv.get(), d_x.get(), d_w.get(), m, n, c.k, dtype, dtype, nullptr));
        LITELLAMA_ASSERT_OK(launch_qkv_rope(
            want_q.get(), want_k.get(), want_v.get(), d_qkv.get(), bias_ptr, nullptr, nullptr,
            d_freq.as<float>(), d_pos.as<int32_t>(), d_slots.as<int32_t>(), freq_row_ptr, m,
            c.n_heads, c.n_kv_heads, c.head_dim, 0.9f, 1e-6f, dtype, nullptr));
        const GemvRope rope = rope_into(got_q, got_k, got_v, bias_ptr, d_freq, d_pos, d_slots,
                                        freq_row_ptr, c.n_heads, c.n_kv_heads, c.head_dim, 0.9f);
        LITELLAMA_ASSERT_OK(
            launch_gemv_qkv_rope(rope, d_x.get(), d_w.get(), m, c.k, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(gpu_test::all_close(download_as_f32(got_q, q_numel, dtype),
                                        download_as_f32(want_q, q_numel, dtype), dtype));
        const auto gk = download_as_f32(got_k, pool_numel, dtype);
        const auto wk = download_as_f32(want_k, pool_numel, dtype);
        const auto gv = download_as_f32(got_v, pool_numel, dtype);
        const auto wv = download_as_f32(want_v, pool_numel, dtype);
        // Unwritten slots stay NaN in both; written ones agree.
        size_t mismatched_nan = 0;
        std::vector<float> gk_w, wk_w, gv_w, wv_w;
        for (size_t i = 0; i < pool_numel; ++i) {
          mismatched_nan += std::isnan(gk[i]) != std::isnan(wk[i]);
          mismatched_nan += std::isnan(gv[i]) != std::isnan(wv[i]);
          if (!std::isnan(wk[i])) {
            gk_w.push_back(gk[i]);
            wk_w.push_back(wk[i]);
          }
          if (!std::isnan(wv[i])) {
            gv_w.push_back(gv[i]);
            wv_w.push_back(wv[i]);
          }
        }
        EXPECT_EQ(mismatched_nan, 0u);
        EXPECT_FALSE(wk_w.empty());
        EXPECT_TRUE(gpu_test::all_close(gk_w, wk_w, dtype));
        EXPECT_TRUE(gpu_test::all_close(gv_w, wv_w, dtype));
      }
    }
  }
}

// Multiplies column j of the [rows, k] matrix w by gamma[j], rounding each product to dtype once:
// how the CUDA runner folds a norm's weight into the projection after it.
Tensor fold_columns(const Tensor& w, const std::vector<float>& gamma, DType dtype) {
  std::vector<float> f(w.values.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = w.values[i] * gamma[i % gamma.size()];
  Tensor t;
  t.bytes.resize(f.size() * dtype_size_bytes(dtype));
  convert_from_f32(t.bytes.data(), dtype, f.data(), f.size());
  t.values.resize(f.size());
  convert_to_f32(t.values.data(), t.bytes.data(), dtype, f.size());
  return t;
}

// The RMSNorm folded into the QKV RoPE GEMV (GemvRmsNorm): from the un-normalized residual rows
// and the weights with the norm's weight folded in, the same Q, K and V as add_rmsnorm and then
// the GEMV on the checkpoint's weights, within the dtype's tolerance (the normalized rows and the
// folded weights round differently). Rows of several magnitudes, so that a missing or wrong
// scale would be far outside it.
TEST(CudaGemv, FoldedRmsNormMatchesNormThenGemv) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(37);
  constexpr float kEps = 1e-5f;
  auto residual_rows = [&](int32_t m, int32_t k, DType dtype) {
    std::vector<float> v = random_floats(static_cast<size_t>(m) * k, -1, 1, rng);
    for (int32_t t = 0; t < m; ++t) {
      const float magnitude = 0.25f * static_cast<float>(1 << (t % 5));  // 0.25 to 4
      for (int32_t j = 0; j < k; ++j) v[static_cast<size_t>(t) * k + j] *= magnitude;
    }
    Tensor x;
    x.bytes.resize(v.size() * dtype_size_bytes(dtype));
    convert_from_f32(x.bytes.data(), dtype, v.data(), v.size());
    return x;
  };
  for (DType dtype : kHalfDtypes) {
    const size_t e = dtype_size_bytes(dtype);
    for (int32_t m : {1, 3, 8}) {
      // QKV + RoPE: Llama-3.2-1B's heads, and Qwen2.5-1.5B's with the QKV bias.
      struct Heads {
        int32_t n_heads, n_kv_heads, head_dim, k;
        bool bias;
      };
      // The third takes the looping kernel from 3 rows (k 1024), with more head halves than
      // resident blocks (each block takes several in turn); the second, on a GPU with at least
      // 128 multiprocessors, two tiles of 16 rows per block with 16 warps at 1 row and one tile
      // of 8 rotary pairs per block at 3; the last (k 4096) 32-byte chunks, one unit per block at
      // 1 row.
      for (const Heads& c : {Heads{32, 8, 64, 2048, false}, Heads{12, 2, 128, 1536, true},
                             Heads{256, 64, 64, 1024, false}, Heads{8, 2, 128, 4096, false}}) {
        SCOPED_TRACE(testing::Message() << gpu_test::dtype_label(dtype) << " qkv m " << m
                                        << " heads " << c.n_heads << " k " << c.k);
        const int32_t n = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
        const int32_t half = c.head_dim / 2;
        const float amp = 1.0f / std::sqrt(static_cast<float>(c.k));
        const Tensor x = residual_rows(m, c.k, dtype);
        const Tensor w = random_tensor(static_cast<size_t>(n) * c.k, dtype, -amp, amp, rng);
        const std::vector<float> gamma = random_floats(static_cast<size_t>(c.k), 0.2f, 2.0f, rng);
        const Tensor folded = fold_columns(w, gamma, dtype);
        const std::vector<float> bias = random_floats(static_cast<size_t>(n), -0.5f, 0.5f, rng);
        std::vector<float> inv_freq(static_cast<size_t>(half));
        for (int32_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0f, -1.0f * i / half);
        std::vector<int32_t> positions, slots;
        for (int32_t t = 0; t < m; ++t) {
          positions.push_back(29 * t + 7);
          slots.push_back(t);  // m slots, each written by one token
        }
        DevBuf d_x = upload(x.bytes), d_res = upload(x.bytes), d_w = upload(w.bytes);
        DevBuf d_folded = upload(folded.bytes), d_gamma = upload(gamma), d_bias = upload(bias);
        DevBuf d_freq = upload(inv_freq), d_pos = upload(positions), d_slots = upload(slots);
        DevBuf d_normed(x.bytes.size());
        const size_t q_numel = static_cast<size_t>(m) * c.n_heads * c.head_dim;
        const size_t kv_numel = static_cast<size_t>(m) * c.n_kv_heads * c.head_dim;
        DevBuf want_q(q_numel * e), want_k(kv_numel * e), want_v(kv_numel * e);
        DevBuf got_q(q_numel * e), got_k(kv_numel * e), got_v(kv_numel * e);
        const float* bias_ptr = c.bias ? d_bias.as<float>() : nullptr;
        auto rope = [&](DevBuf& q, DevBuf& k, DevBuf& v) {
          return rope_into(q, k, v, bias_ptr, d_freq, d_pos, d_slots, nullptr, c.n_heads,
                           c.n_kv_heads, c.head_dim, 1.0f);
        };
        LITELLAMA_ASSERT_OK(launch_add_rmsnorm(d_normed.get(), d_res.get(), nullptr,
                                               d_gamma.as<float>(), m, c.k, kEps, dtype, nullptr));
        LITELLAMA_ASSERT_OK(launch_gemv_qkv_rope(rope(want_q, want_k, want_v), d_normed.get(),
                                                 d_w.get(), m, c.k, dtype, nullptr));
        LITELLAMA_ASSERT_OK(launch_gemv_qkv_rope(rope(got_q, got_k, got_v), d_x.get(),
                                                 d_folded.get(), m, c.k, dtype, nullptr,
                                                 GemvRmsNorm{kEps}));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        // Both paths round the two halves of a head to dtype before RoPE. Where both roundings go
        // the other way at a magnitude of 1 to 2, a rotated output moves by up to two of those
        // units plus its own rounding: 5 * 2^-8 (0.0195) in bfloat16, seen once among the
        // 131072 Q elements of the largest case, just past tolerance(bfloat16).
        constexpr double kScale = 1.5;
        EXPECT_TRUE(gpu_test::all_close(download_as_f32(got_q, q_numel, dtype),
                                        download_as_f32(want_q, q_numel, dtype), dtype, kScale));
        EXPECT_TRUE(gpu_test::all_close(download_as_f32(got_k, kv_numel, dtype),
                                        download_as_f32(want_k, kv_numel, dtype), dtype, kScale));
        EXPECT_TRUE(gpu_test::all_close(download_as_f32(got_v, kv_numel, dtype),
                                        download_as_f32(want_v, kv_numel, dtype), dtype, kScale));
      }
    }
  }
}

TEST(CudaGemv, RefusesWhatItDoesNotRun) {
  EXPECT_FALSE(gemv_supports(DType::kF32, DType::kF32, 1, 64));
  EXPECT_FALSE(gemv_supports(DType::kBF16, DType::kF16, 1, 64));
  EXPECT_FALSE(gemv_supports(DType::kBF16, DType::kBF16, 0, 64));
  EXPECT_FALSE(gemv_supports(DType::kBF16, DType::kBF16, kGemvMaxRows + 1, 64));
  EXPECT_FALSE(gemv_supports(DType::kF16, DType::kF16, 1, 96));
  EXPECT_TRUE(gemv_supports(DType::kF16, DType::kF32, kGemvMaxRows, 128));
  const Status st =
      launch_gemv(nullptr, nullptr, nullptr, 1, 16, 48, DType::kBF16, DType::kBF16, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(gemv_residual_add_k_segments(DType::kBF16, 1, 2048, 48), 0);
  // The portable kernel never cuts k into segments (the tensor-core policy does, on the H200 at
  // this shape 4: CudaModelRunner.SegmentedDownProjectionMatchesReferencePath).
  if (LITELLAMA_PORTABLE_KERNELS) {
    EXPECT_EQ(gemv_residual_add_k_segments(DType::kBF16, 1, 1536, 8960), 1);
  }
}

// A layer-like chain (GEMV -> residual add + RMSNorm -> GEMV -> ...), each kernel reading what
// the previous one wrote. Bit-identical with and without PDL, direct and from a graph.
class PdlChain {
 public:
  static constexpr int32_t kM = 4, kH = 1024, kLayers = 24;
  static constexpr size_t kBytes = size_t{kM} * kH * 2;
  explicit PdlChain(std::mt19937& rng)
      : norm_(upload(random_floats(kH, 0.5f, 1.5f, rng))),
        residual_(kBytes),
        normed_(kBytes),
        delta_(kBytes),
        x0_(random_tensor(static_cast<size_t>(kM) * kH, DType::kBF16, -1, 1, rng).bytes) {
    const float amp = 1.0f / std::sqrt(static_cast<float>(kH));
    for (int32_t l = 0; l < kLayers; ++l) {
      w_.push_back(
          upload(random_tensor(static_cast<size_t>(kH) * kH, DType::kBF16, -amp, amp, rng).bytes));
    }
  }
  // The chain on `stream`, its kernels launched with PDL when `pdl`.
  Status run(cudaStream_t raw_stream, bool pdl) {
    const KernelStream stream(raw_stream, pdl);
    LITELLAMA_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(residual_.get(), x0_.data(), x0_.size(),
                                                      cudaMemcpyHostToDevice, raw_stream)));
    for (int32_t l = 0; l < kLayers; ++l) {
      LITELLAMA_RETURN_IF_ERROR(
          launch_add_rmsnorm(normed_.get(), residual_.get(), l == 0 ? nullptr : delta_.get(),
                             norm_.as<float>(), kM, kH, 1e-5f, DType::kBF16, stream));
      LITELLAMA_RETURN_IF_ERROR(launch_gemv(delta_.get(), normed_.get(), w_[l].get(), kM, kH, kH,
                                            DType::kBF16, DType::kBF16, stream));
    }
    return Status::ok();
  }
  std::vector<uint16_t> result() const {
    return download<uint16_t>(delta_, static_cast<size_t>(kM) * kH);
  }

 private:
  static Status cuda_ok(cudaError_t e) {
    return e == cudaSuccess ? Status::ok() : Status(StatusCode::kInternal, cudaGetErrorString(e));
  }
  DevBuf norm_, residual_, normed_, delta_;
  std::vector<uint8_t> x0_;
  std::vector<DevBuf> w_;
};

// Enqueues `enqueue` on `stream` `reps` times directly, then captures it once into a CUDA graph and
// replays that `reps` times; after every run `result()` must equal `want`.
template <typename Enqueue, typename ReadResult, typename Want>
void expect_each_run_gives(cudaStream_t stream, int reps, Enqueue enqueue, ReadResult result,
                           const Want& want) {
  for (int rep = 0; rep < reps; ++rep) {
    LITELLAMA_ASSERT_OK(enqueue());
    LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
    ASSERT_EQ(result(), want) << "direct launch, repetition " << rep;
  }
  cudaGraph_t graph = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status recorded = enqueue();
  LITELLAMA_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  LITELLAMA_ASSERT_OK(recorded);
  cudaGraphExec_t exec = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < reps; ++rep) {
    LITELLAMA_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
    ASSERT_EQ(result(), want) << "graph replay " << rep;
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST(CudaGemv, ProgrammaticLaunchChainIsExactDirectAndInGraphs) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("programmatic dependent launch");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  int major = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  std::mt19937 rng(33);
  PdlChain chain(rng);
  cudaStream_t stream = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  LITELLAMA_ASSERT_OK(chain.run(stream, /*pdl=*/false));
  LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const auto want = chain.result();

  // PDL is what this test is about: it must be available where the device has it.
  EXPECT_EQ(current_device_supports_programmatic_launch(), major >= 9);
  expect_each_run_gives(
      stream, 20, [&] { return chain.run(stream, /*pdl=*/true); }, [&] { return chain.result(); },
      want);
  (void)cudaStreamDestroy(stream);
}

// kernels/block_trace.h. Built without LITELLAMA_PROFILING, a trace is refused. Built with it,
// a GEMV of 128 tiles (one unit per block) and an add_rmsnorm of 3 rows leave one record per
// block: each block index once, on one of the device's multiprocessors, start <= release <= end,
// the add_rmsnorm blocks released no earlier than the GEMV's last block ended (it depends on
// the GEMV). Stopping twice is refused.
TEST(BlockTrace, RecordsEveryBlockOrIsRefused) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  if (!block_trace_compiled()) {
    const Status s = block_trace_start(1024);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_FALSE(block_trace_stop().is_ok());
    return;
  }
  std::mt19937 rng(36);
  const DType dtype = DType::kBF16;
  const int32_t n = 2048, k = 2048, rows = 3;
  const Tensor x = random_tensor(static_cast<size_t>(rows) * k, dtype, -1, 1, rng);
  const Tensor w = random_tensor(static_cast<size_t>(n) * k, dtype, -0.02f, 0.02f, rng);
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes), d_ones = upload(ones);
  DevBuf d_y(static_cast<size_t>(rows) * n * 2), d_normed(static_cast<size_t>(rows) * n * 2);
  EXPECT_FALSE(block_trace_start(0).is_ok());
  LITELLAMA_ASSERT_OK(block_trace_start(4096));
  LITELLAMA_ASSERT_OK(launch_gemv(d_y.get(), d_x.get(), d_w.get(), 1, n, k, dtype, dtype, nullptr));
  LITELLAMA_ASSERT_OK(launch_add_rmsnorm(d_normed.get(), d_y.get(), nullptr, d_ones.as<float>(),
                                         rows, n, 1e-5f, dtype, nullptr));
  int64_t dropped = -1;
  auto records = block_trace_stop(&dropped);
  LITELLAMA_ASSERT_OK(records.status());
  EXPECT_EQ(dropped, 0);
  EXPECT_FALSE(block_trace_stop().is_ok());
  int sms = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<int> gemv_seen(n / 16, 0), norm_seen(rows, 0);
  uint64_t gemv_last_end = 0;
  for (const BlockTraceRecord& r : *records) {
    EXPECT_LT(r.sm, static_cast<uint32_t>(sms));
    EXPECT_LE(r.start_ns, r.released_ns);
    EXPECT_LE(r.released_ns, r.end_ns);
    if (r.kernel == static_cast<uint32_t>(BlockTraceKernel::kGemv)) {
      EXPECT_EQ(r.n_blocks, static_cast<uint32_t>(n / 16));
      ASSERT_LT(r.block, static_cast<uint32_t>(n / 16));
      ++gemv_seen[r.block];
      gemv_last_end = std::max(gemv_last_end, r.end_ns);
    }
  }
  for (const BlockTraceRecord& r : *records) {
    if (r.kernel != static_cast<uint32_t>(BlockTraceKernel::kAddRmsNorm)) continue;
    EXPECT_EQ(r.n_blocks, static_cast<uint32_t>(rows));
    ASSERT_LT(r.block, static_cast<uint32_t>(rows));
    ++norm_seen[r.block];
    EXPECT_GE(r.released_ns, gemv_last_end);
  }
  EXPECT_EQ(records->size(), static_cast<size_t>(n / 16 + rows));
  EXPECT_EQ(gemv_seen, std::vector<int>(n / 16, 1));
  EXPECT_EQ(norm_seen, std::vector<int>(rows, 1));
}

// Decode attention right after the kernel that writes each sequence's newest K/V (qkv_rope), with
// programmatic dependent launch: for up to 8 sequences attention_decode loads its first K/V tiles
// before it waits, and must still see the newest key as written. A long GEMV (one wave of blocks
// that let their dependents launch at once) runs first, so attention's early loads happen well
// before qkv_rope, which waits for the GEMV, writes; until then the newest slots hold NaN. The
// outputs must equal those of the same kernels run without PDL, directly and from a graph.
TEST(CudaPdl, DecodeAttentionSeesTheNewestKeyItsProducerWrites) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("programmatic dependent launch");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(41);
  constexpr int32_t kHeads = 32, kKvHeads = 8;
  constexpr int32_t kLongN = 2048, kLongK = 32768;  // 128 MiB of weights: tens of microseconds
  int n_sms = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream = nullptr;
  LITELLAMA_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DevBuf d_long_x(static_cast<size_t>(kLongK) * 2), d_long_y(static_cast<size_t>(kLongN) * 2);
  DevBuf d_long_w(static_cast<size_t>(kLongN) * kLongK * 2);  // NaN bytes: the result is unused
  // Eight sequences (newest keys first in a tile, last in one, and past the first stages; few
  // splits, merged in a cluster on the H200), and two (one of a single key, whose later splits are
  // empty, and a long one: more splits than a cluster holds, merged through the workspace).
  const std::vector<std::vector<int32_t>> batches{{1, 64, 65, 128, 130, 200, 512, 1500}, {1, 6000}};
  for (const std::vector<int32_t>& kv_len : batches) {
    const auto n = static_cast<int32_t>(kv_len.size());
    const int32_t max_kv_len = *std::max_element(kv_len.begin(), kv_len.end());
    const int32_t total = std::accumulate(kv_len.begin(), kv_len.end(), 0);
    const int32_t n_slots = total + 13;
    std::vector<int32_t> perm(static_cast<size_t>(n_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> slot_start{0}, token_start{0}, positions, token_slot, seq_ids;
    const std::vector<int32_t> slot_table(perm.begin(), perm.begin() + total);
    for (int32_t s = 0; s < n; ++s) {
      slot_start.push_back(slot_start.back() + kv_len[static_cast<size_t>(s)]);
      token_start.push_back(s + 1);
      positions.push_back(kv_len[static_cast<size_t>(s)] - 1);
      token_slot.push_back(slot_table[static_cast<size_t>(slot_start.back() - 1)]);
      seq_ids.push_back(s);
    }
    DevBuf d_slot_start = upload(slot_start), d_token_start = upload(token_start);
    DevBuf d_kv_len = upload(kv_len), d_slot_table = upload(slot_table);
    DevBuf d_positions = upload(positions), d_token_slot = upload(token_slot);
    DevBuf d_seq_ids = upload(seq_ids);
    for (DType dtype : kHalfDtypes) {
      for (int32_t head_dim : {64, 128}) {
        SCOPED_TRACE(testing::Message() << gpu_test::dtype_label(dtype) << " head_dim " << head_dim
                                        << " sequences " << n << " longest " << max_kv_len);
        const size_t e = dtype_size_bytes(dtype);
        const size_t kv_row = static_cast<size_t>(kKvHeads) * head_dim;
        const size_t q_numel = static_cast<size_t>(n) * kHeads * head_dim;
        const Tensor qkv = random_tensor(
            static_cast<size_t>(n) * (kHeads + 2 * kKvHeads) * head_dim, dtype, -1, 1, rng);
        Tensor pool_k = random_tensor(static_cast<size_t>(n_slots) * kv_row, dtype, -1, 1, rng);
        Tensor pool_v = random_tensor(static_cast<size_t>(n_slots) * kv_row, dtype, -1, 1, rng);
        for (int32_t slot : token_slot) {  // the newest keys: NaN until qkv_rope writes them
          std::fill_n(pool_k.bytes.begin() + static_cast<ptrdiff_t>(slot * kv_row * e), kv_row * e,
                      uint8_t{0xff});
          std::fill_n(pool_v.bytes.begin() + static_cast<ptrdiff_t>(slot * kv_row * e), kv_row * e,
                      uint8_t{0xff});
        }
        std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / head_dim);
        }
        DevBuf d_qkv = upload(qkv.bytes), d_inv_freq = upload(inv_freq);
        DevBuf d_k_init = upload(pool_k.bytes), d_v_init = upload(pool_v.bytes);
        DevBuf d_k(pool_k.bytes.size()), d_v(pool_v.bytes.size()), d_q(q_numel * e);
        DevBuf d_out(q_numel * e);
        const size_t ws_bytes =
            attention_decode_workspace_size_bytes(n, kHeads, kKvHeads, head_dim, max_kv_len, n_sms);
        DevBuf d_ws(ws_bytes);
        // Resets the pools and poisons the output, then runs the kernels (all on `stream`).
        auto step = [&](bool long_kernel_first, bool pdl) -> Status {
          const KernelStream ks(stream, pdl);
          const bool reset = cudaMemcpyAsync(d_k.get(), d_k_init.get(), pool_k.bytes.size(),
                                             cudaMemcpyDeviceToDevice, stream) == cudaSuccess &&
                             cudaMemcpyAsync(d_v.get(), d_v_init.get(), pool_v.bytes.size(),
                                             cudaMemcpyDeviceToDevice, stream) == cudaSuccess &&
                             cudaMemsetAsync(d_out.get(), 0xff, q_numel * e, stream) == cudaSuccess;
          if (!reset) return Status(StatusCode::kInternal, "reset failed");
          if (long_kernel_first) {
            LITELLAMA_RETURN_IF_ERROR(launch_gemv(d_long_y.get(), d_long_x.get(), d_long_w.get(), 1,
                                                  kLongN, kLongK, dtype, dtype, ks));
          }
          LITELLAMA_RETURN_IF_ERROR(launch_qkv_rope(
              d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), nullptr, nullptr, nullptr,
              d_inv_freq.as<float>(), d_positions.as<int32_t>(), d_token_slot.as<int32_t>(),
              nullptr, n, kHeads, kKvHeads, head_dim, 1.0f, 1e-6f, dtype, ks));
          return launch_attention_decode(
              AttentionTensors<void>{d_out.get(), d_q.get(), d_k.get(), d_v.get(),
                                     d_token_start.as<int32_t>(), d_kv_len.as<int32_t>(),
                                     d_slot_start.as<int32_t>(), d_slot_table.as<int32_t>(),
                                     d_seq_ids.as<int32_t>()},
              n, max_kv_len, kHeads, kKvHeads, head_dim, dtype,
              1.0f / std::sqrt(static_cast<float>(head_dim)), n_sms, d_ws.get(), ws_bytes, ks);
        };
        LITELLAMA_ASSERT_OK(step(false, /*pdl=*/false));
        LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
        const auto want = download<uint16_t>(d_out, q_numel);
        const auto want_f32 = download_as_f32(d_out, q_numel, dtype);
        ASSERT_TRUE(std::all_of(want_f32.begin(), want_f32.end(),
                                [](float x) { return std::isfinite(x); }));

        expect_each_run_gives(
            stream, 5, [&] { return step(true, /*pdl=*/true); },
            [&] { return download<uint16_t>(d_out, q_numel); }, want);
      }
    }
  }
  (void)cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace litellama
