// The element-wise kernels of the CUDA backend and its GEMM wrapper against their CPU references
// (kernels/reference/), in float32, bfloat16 and float16, on odd and realistic shapes. Outputs are
// poisoned with NaN first, so every element must be written; fused kernels are compared with the
// unfused sequence built from references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/add_rmsnorm.h"
#include "kernels/embedding.h"
#include "kernels/gather_rows.h"
#include "kernels/gpu_runtime.h"
#include "kernels/linear.h"
#include "kernels/qkv_rope.h"
#include "kernels/reference/add_rmsnorm.h"
#include "kernels/reference/embedding.h"
#include "kernels/reference/gather_rows.h"
#include "kernels/reference/qkv_rope.h"
#include "kernels/reference/silu_mul.h"
#include "kernels/silu_mul.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

// The GPU tests' shared helpers (device buffers, random tensors, tolerances).
using namespace gpu_test;  // NOLINT(google-build-using-namespace)

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr int32_t kTokenCounts[] = {1, 3, 7, 19, 733};

// Rounds float values to `dtype` and back (what a stored intermediate holds).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> bytes(v.size() * dtype_size_bytes(dtype));
  convert_from_f32(bytes.data(), dtype, v.data(), v.size());
  std::vector<float> out(v.size());
  convert_to_f32(out.data(), bytes.data(), dtype, v.size());
  return out;
}

TEST(CudaKernels, Embedding) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(1);
  for (DType dtype : kDtypes) {
    for (int32_t hidden : {64, 100, 2048, 4095}) {
      const int32_t vocab = 1000;
      const Tensor table = random_tensor(size_t{1} * vocab * hidden, dtype, -1, 1, rng);
      for (int32_t n : kTokenCounts) {
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " hidden " << hidden << " n_tokens " << n);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
        for (auto& id : ids) id = pick(rng);
        ids[0] = vocab - 1;
        DevBuf d_table = upload(table.bytes), d_ids = upload(ids);
        DevBuf d_out(static_cast<size_t>(n) * hidden * dtype_size_bytes(dtype));
        LITELLAMA_ASSERT_OK(launch_embedding(d_out.get(), d_ids.as<int32_t>(), d_table.get(), n,
                                             hidden, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        std::vector<float> ref(static_cast<size_t>(n) * hidden);
        reference::embedding(ref.data(), ids.data(), table.values.data(), n, hidden);
        const auto out = download_as_f32(d_out, ref.size(), dtype);
        EXPECT_EQ(out, ref);
      }
    }
  }
}

TEST(CudaKernels, AddRmsNormMatchesAddThenRmsNorm) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(2);
  for (DType dtype : kDtypes) {
    for (int32_t hidden : {64, 100, 2048, 4096, 4095}) {
      for (int32_t n : kTokenCounts) {
        for (bool with_delta : {true, false}) {
          SCOPED_TRACE(testing::Message() << gpu_test::dtype_label(dtype) << " hidden " << hidden
                                          << " rows " << n << " delta " << with_delta);
          const size_t numel = static_cast<size_t>(n) * hidden;
          const Tensor residual = random_tensor(numel, dtype, -2, 2, rng);
          const Tensor delta = random_tensor(numel, dtype, -2, 2, rng);
          const auto weight = random_floats(static_cast<size_t>(hidden), 0.5f, 1.5f, rng);
          const float eps = 1e-5f;
          DevBuf d_res = upload(residual.bytes), d_delta = upload(delta.bytes);
          DevBuf d_w = upload(weight), d_out(numel * dtype_size_bytes(dtype));
          LITELLAMA_ASSERT_OK(launch_add_rmsnorm(d_out.get(), d_res.get(),
                                                 with_delta ? d_delta.get() : nullptr,
                                                 d_w.as<float>(), n, hidden, eps, dtype, nullptr));
          LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
          // Unfused: add (stored in dtype), then rmsnorm.
          std::vector<float> ref_res = residual.values;
          if (with_delta) {
            reference::add(ref_res.data(), delta.values.data(), static_cast<int64_t>(numel));
            ref_res = rounded(ref_res, dtype);
          }
          std::vector<float> ref_out(numel);
          reference::rmsnorm(ref_out.data(), ref_res.data(), weight.data(), n, hidden, eps);
          EXPECT_TRUE(all_close(download_as_f32(d_res, numel, dtype), ref_res, dtype));
          EXPECT_TRUE(all_close(download_as_f32(d_out, numel, dtype), ref_out, dtype));
        }
      }
    }
  }
}

TEST(CudaKernels, SiluMul) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(3);
  for (DType dtype : kDtypes) {
    for (int32_t inter : {64, 100, 8192, 4097}) {
      for (int32_t n : kTokenCounts) {
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " inter " << inter << " n_tokens " << n);
        const size_t numel = static_cast<size_t>(n) * inter;
        const Tensor gate_up = random_tensor(2 * numel, dtype, -6, 6, rng);
        DevBuf d_in = upload(gate_up.bytes), d_out(numel * dtype_size_bytes(dtype));
        LITELLAMA_ASSERT_OK(launch_silu_mul(d_out.get(), d_in.get(), n, inter, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        std::vector<float> ref(numel);
        reference::silu_mul(ref.data(), gate_up.values.data(), n, inter);
        EXPECT_TRUE(all_close(download_as_f32(d_out, numel, dtype), ref, dtype));
      }
    }
  }
}

TEST(CudaKernels, GatherRows) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(4);
  for (DType dtype : kDtypes) {
    for (int32_t cols : {64, 100, 2048}) {
      for (int32_t n_in : kTokenCounts) {
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " cols " << cols << " rows " << n_in);
        const Tensor in = random_tensor(static_cast<size_t>(n_in) * cols, dtype, -1, 1, rng);
        std::vector<int32_t> rows;
        std::uniform_int_distribution<int32_t> pick(0, n_in - 1);
        for (int32_t i = 0; i < std::min(n_in, 37); ++i) rows.push_back(pick(rng));
        rows.back() = n_in - 1;
        const auto n_out = static_cast<int32_t>(rows.size());
        DevBuf d_in = upload(in.bytes), d_rows = upload(rows);
        DevBuf d_out(static_cast<size_t>(n_out) * cols * dtype_size_bytes(dtype));
        LITELLAMA_ASSERT_OK(launch_gather_rows(d_out.get(), d_in.get(), d_rows.as<int32_t>(), n_out,
                                               cols, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
        std::vector<float> ref(static_cast<size_t>(n_out) * cols);
        reference::gather_rows(ref.data(), in.values.data(), rows.data(), n_out, cols);
        EXPECT_EQ(download_as_f32(d_out, ref.size(), dtype), ref);
      }
    }
  }
}

struct QkvCase {
  int32_t head_dim, n_heads, n_kv_heads;
};

// qkv_rope against: split, + bias, per-head RMSNorm (q and k), RoPE with each token's own
// inverse-frequency row and attention scaling, store of K and V into their slots.
TEST(CudaKernels, QkvRopeMatchesUnfusedSequence) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(5);
  const QkvCase cases[] = {{64, 8, 8},  {64, 16, 4}, {128, 32, 4}, {128, 8, 8}, {128, 16, 4},
                           {64, 32, 4}, {16, 8, 2},  {32, 7, 1},   {48, 6, 2},  {80, 5, 5},
                           {96, 3, 1},  {256, 4, 2}, {2, 4, 1},    {250, 2, 2}};
  int variant = 0;
  for (DType dtype : kDtypes) {
    for (const QkvCase& c : cases) {
      for (int32_t n : kTokenCounts) {
        ++variant;
        const bool bias = variant % 2 == 0;
        const bool qk_norm = variant % 3 == 0;
        const bool freq_rows = variant % 4 != 1;  // several tables, one per "sequence"
        const float scaling = variant % 5 == 0 ? 1.2f : 1.0f;
        SCOPED_TRACE(testing::Message()
                     << gpu_test::dtype_label(dtype) << " head_dim " << c.head_dim << " heads "
                     << c.n_heads << "/" << c.n_kv_heads << " n_tokens " << n << " bias " << bias
                     << " qk_norm " << qk_norm << " freq_rows " << freq_rows);
        const int32_t hd = c.head_dim, half = hd / 2;
        const int32_t n_total = c.n_heads + 2 * c.n_kv_heads;
        const size_t row = static_cast<size_t>(n_total) * hd;
        const size_t kv_row = static_cast<size_t>(c.n_kv_heads) * hd;
        const Tensor qkv = random_tensor(static_cast<size_t>(n) * row, dtype, -2, 2, rng);
        const auto bias_v = random_floats(row, -0.5f, 0.5f, rng);
        const auto q_norm = random_floats(static_cast<size_t>(hd), 0.5f, 1.5f, rng);
        const auto k_norm = random_floats(static_cast<size_t>(hd), 0.5f, 1.5f, rng);
        const int32_t n_rows = freq_rows ? 3 : 1;
        std::vector<float> table(static_cast<size_t>(n_rows) * half);
        for (int32_t r = 0; r < n_rows; ++r) {
          const double base = 10000.0 * (1 + 3 * r);
          for (int32_t i = 0; i < half; ++i) {
            table[static_cast<size_t>(r) * half + i] =
                1.0f / std::pow(static_cast<float>(base), static_cast<float>(2 * i) / hd);
          }
        }
        std::vector<int32_t> positions(static_cast<size_t>(n)), token_row(positions.size());
        std::uniform_int_distribution<int32_t> pos(0, 130000), row_pick(0, n_rows - 1);
        for (size_t t = 0; t < positions.size(); ++t) {
          positions[t] = pos(rng);
          token_row[t] = row_pick(rng);
        }
        const int32_t n_slots = 2 * n + 5;
        std::vector<int32_t> perm(static_cast<size_t>(n_slots));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const std::vector<int32_t> slots(perm.begin(), perm.begin() + n);

        const size_t e = dtype_size_bytes(dtype);
        DevBuf d_qkv = upload(qkv.bytes), d_bias = upload(bias_v), d_qn = upload(q_norm),
               d_kn = upload(k_norm), d_table = upload(table), d_pos = upload(positions),
               d_slots = upload(slots), d_rows = upload(token_row);
        DevBuf d_q(static_cast<size_t>(n) * c.n_heads * hd * e);
        DevBuf d_k(static_cast<size_t>(n_slots) * kv_row * e);
        DevBuf d_v(static_cast<size_t>(n_slots) * kv_row * e);
        LITELLAMA_ASSERT_OK(launch_qkv_rope(
            d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), bias ? d_bias.as<float>() : nullptr,
            qk_norm ? d_qn.as<float>() : nullptr, qk_norm ? d_kn.as<float>() : nullptr,
            d_table.as<float>(), d_pos.as<int32_t>(), d_slots.as<int32_t>(),
            freq_rows ? d_rows.as<int32_t>() : nullptr, n, c.n_heads, c.n_kv_heads, hd, scaling,
            1e-6f, dtype, nullptr));
        LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());

        // Reference, unfused.
        std::vector<float> q(static_cast<size_t>(n) * c.n_heads * hd), k(n * kv_row), v(n * kv_row);
        for (int32_t t = 0; t < n; ++t) {
          const float* src = qkv.values.data() + t * row;
          std::copy(src, src + q.size() / n, q.data() + t * (q.size() / n));
          std::copy(src + q.size() / n, src + q.size() / n + kv_row, k.data() + t * kv_row);
          std::copy(src + q.size() / n + kv_row, src + row, v.data() + t * kv_row);
          if (bias) {
            reference::add(q.data() + t * (q.size() / n), bias_v.data(),
                           static_cast<int64_t>(q.size() / n));
            reference::add(k.data() + t * kv_row, bias_v.data() + q.size() / n,
                           static_cast<int64_t>(kv_row));
            reference::add(v.data() + t * kv_row, bias_v.data() + q.size() / n + kv_row,
                           static_cast<int64_t>(kv_row));
          }
        }
        if (qk_norm) {
          reference::rmsnorm_per_head(q.data(), q_norm.data(), n, c.n_heads, hd, 1e-6f);
          reference::rmsnorm_per_head(k.data(), k_norm.data(), n, c.n_kv_heads, hd, 1e-6f);
        }
        std::vector<float> per_token(static_cast<size_t>(n) * half);
        for (int32_t t = 0; t < n; ++t) {
          const int32_t r = freq_rows ? token_row[static_cast<size_t>(t)] : 0;
          std::copy(table.begin() + r * half, table.begin() + (r + 1) * half,
                    per_token.begin() + t * half);
        }
        reference::rope(q.data(), positions.data(), per_token.data(), n, c.n_heads, hd, scaling);
        reference::rope(k.data(), positions.data(), per_token.data(), n, c.n_kv_heads, hd, scaling);
        std::vector<float> k_pool(static_cast<size_t>(n_slots) * kv_row, NAN),
            v_pool(k_pool.size(), NAN);
        reference::store_slots(k_pool.data(), k.data(), slots.data(), n,
                               static_cast<int64_t>(kv_row));
        reference::store_slots(v_pool.data(), v.data(), slots.data(), n,
                               static_cast<int64_t>(kv_row));

        EXPECT_TRUE(all_close(download_as_f32(d_q, q.size(), dtype), q, dtype));
        // Written slots match; the others are still poison.
        auto check_pool = [&](const DevBuf& d, const std::vector<float>& ref) {
          const auto got = download_as_f32(d, ref.size(), dtype);
          std::vector<float> got_written, ref_written;
          size_t touched = 0;
          for (int32_t s = 0; s < n_slots; ++s) {
            const bool written = std::find(slots.begin(), slots.end(), s) != slots.end();
            for (size_t i = 0; i < kv_row; ++i) {
              const size_t at = static_cast<size_t>(s) * kv_row + i;
              if (written) {
                got_written.push_back(got[at]);
                ref_written.push_back(ref[at]);
              } else if (!std::isnan(got[at])) {
                ++touched;
              }
            }
          }
          EXPECT_EQ(touched, 0u) << "elements of unlisted slots were overwritten";
          EXPECT_TRUE(all_close(got_written, ref_written, dtype));
        };
        check_pool(d_k, k_pool);
        check_pool(d_v, v_pool);
      }
    }
  }
}

// y = x @ w^T in double as the reference; float32 must be float32-accurate (no TF32).
TEST(CudaKernels, Linear) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(6);
  LinearHandle handle = nullptr;
  LITELLAMA_ASSERT_OK(linear_handle_create(&handle));
  struct Shape {
    int32_t n, k;
  };
  for (DType dtype : kDtypes) {
    for (DType out_dtype : {dtype, DType::kF32}) {
      if (!linear_supports(dtype, out_dtype)) continue;
      for (Shape s : {Shape{64, 64}, Shape{200, 136}, Shape{1024, 4096}, Shape{4096, 1024}}) {
        for (int32_t m : kTokenCounts) {
          SCOPED_TRACE(testing::Message()
                       << gpu_test::dtype_label(dtype) << " -> " << gpu_test::dtype_label(out_dtype)
                       << " m " << m << " n " << s.n << " k " << s.k);
          const float amp = 1.0f / std::sqrt(static_cast<float>(s.k));
          const Tensor x = random_tensor(static_cast<size_t>(m) * s.k, dtype, -1, 1, rng);
          const Tensor w = random_tensor(static_cast<size_t>(s.n) * s.k, dtype, -amp, amp, rng);
          DevBuf d_x = upload(x.bytes), d_w = upload(w.bytes);
          DevBuf d_y(static_cast<size_t>(m) * s.n * dtype_size_bytes(out_dtype));
          LITELLAMA_ASSERT_OK(launch_linear(d_y.get(), d_x.get(), d_w.get(), m, s.n, s.k, dtype,
                                            out_dtype, handle, nullptr));
          LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
          const auto y = download_as_f32(d_y, static_cast<size_t>(m) * s.n, out_dtype);
          double err2 = 0, ref2 = 0;
          size_t bad = 0;
          // Every output is checked for NaN/Inf (unwritten); values on a subset of rows.
          for (float v : y) bad += std::isfinite(v) ? 0 : 1;
          const int32_t row_step = m <= 19 ? 1 : 23;
          for (int32_t i = 0; i < m; i += row_step) {
            for (int32_t j = 0; j < s.n; ++j) {
              double acc = 0;
              for (int32_t kk = 0; kk < s.k; ++kk) {
                acc += static_cast<double>(x.values[static_cast<size_t>(i) * s.k + kk]) *
                       w.values[static_cast<size_t>(j) * s.k + kk];
              }
              const double got = y[static_cast<size_t>(i) * s.n + j];
              err2 += (got - acc) * (got - acc);
              ref2 += acc * acc;
            }
          }
          EXPECT_EQ(bad, 0u);
          const double rel = std::sqrt(err2 / ref2);
          const double tol = dtype == DType::kF32       ? 1e-6
                             : out_dtype == DType::kF32 ? 1e-5
                                                        : gpu_test::tolerance(out_dtype) / 2;
          EXPECT_LT(rel, tol);
        }
      }
    }
  }
  linear_handle_destroy(handle);
}

TEST(CudaKernels, SupportPredicates) {
  EXPECT_TRUE(qkv_rope_supports(64, DType::kBF16));
  EXPECT_TRUE(qkv_rope_supports(128, DType::kF32));
  EXPECT_TRUE(qkv_rope_supports(96, DType::kF16));
  EXPECT_TRUE(qkv_rope_supports(16, DType::kBF16));
  EXPECT_FALSE(qkv_rope_supports(95, DType::kF16));   // odd: no rotary pairs
  EXPECT_FALSE(qkv_rope_supports(258, DType::kF16));  // past the general kernel's 256
  EXPECT_FALSE(qkv_rope_supports(128, DType::kI32));
  EXPECT_FALSE(add_rmsnorm_supports(DType::kU8));
  EXPECT_TRUE(linear_supports(DType::kBF16, DType::kF32));
  EXPECT_FALSE(linear_supports(DType::kF32, DType::kBF16));
}

}  // namespace
}  // namespace litellama
