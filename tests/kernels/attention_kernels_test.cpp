// Prefill and decode attention kernels against the CPU reference (kernels/reference/attention.h):
// mixed batches with shuffled slot tables, cached prefixes, GQA ratios, seq_ids subsets; every
// processed row written and finite, rows of other sequences untouched. Also prints the time and
// achieved bandwidth of realistic decode calls (and one prefill) measured with CUDA events.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kernels/gpu_runtime.h"
#include "kernels/reference/attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace litellama {
namespace {

using gpu_test::DevBuf;
using gpu_test::dtype_label;
using gpu_test::Tensor;
using gpu_test::upload;

// ||out - ref|| / ||ref|| over all processed rows, and per (token, head) row.
double tolerance(DType dtype) {
  return gpu_test::per_float_dtype(dtype, 1e-5, 1e-2, 3e-3);
}
constexpr double kRowToleranceFactor = 4.0;

// Values drawn uniformly from [-amplitude, amplitude], stored in `dtype`.
Tensor random_tensor(size_t n, DType dtype, float amplitude, std::mt19937& rng) {
  return gpu_test::random_tensor(n, dtype, -amplitude, amplitude, rng);
}

struct SeqSpec {
  int32_t n_new;
  int32_t n_cached;
};

struct Shape {
  DType dtype;
  int32_t head_dim;
  int32_t n_heads;
  int32_t n_kv_heads;
};

// A packed step: sequences after one another, slot tables drawn from a shuffled pool.
struct Batch {
  std::vector<SeqSpec> seqs;
  std::vector<int32_t> token_start{0};
  std::vector<int32_t> kv_len;
  std::vector<int32_t> slot_start{0};
  std::vector<int32_t> slot_table;
  int32_t n_slots = 0;
  int32_t n_tokens() const { return token_start.back(); }
};

Batch make_batch(const std::vector<SeqSpec>& seqs, std::mt19937& rng) {
  Batch b;
  b.seqs = seqs;
  int32_t total_kv = 0;
  for (const SeqSpec& s : seqs) total_kv += s.n_new + s.n_cached;
  b.n_slots = total_kv + total_kv / 3 + 17;  // unused slots in between
  std::vector<int32_t> perm(b.n_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int32_t next = 0;
  for (const SeqSpec& s : seqs) {
    const int32_t len = s.n_new + s.n_cached;
    b.token_start.push_back(b.token_start.back() + s.n_new);
    b.kv_len.push_back(len);
    for (int32_t p = 0; p < len; ++p) b.slot_table.push_back(perm[next++]);
    b.slot_start.push_back(static_cast<int32_t>(b.slot_table.size()));
  }
  return b;
}

// Which kernel processes which sequences; sequences in neither must stay untouched.
struct Work {
  std::vector<int32_t> prefill_ids;
  std::vector<int32_t> decode_ids;
  int32_t n_sms = 0;                         // decode split plan; 0: the device's count
  size_t decode_workspace_bytes = SIZE_MAX;  // SIZE_MAX: what the plan needs
};

void run_and_check(const Shape& shape, const Batch& batch, const Work& work, float q_amplitude,
                   uint32_t seed, const std::string& label) {
  std::mt19937 rng(seed);
  const int32_t D = shape.head_dim;
  const size_t elem = dtype_size_bytes(shape.dtype);
  const size_t n_q = static_cast<size_t>(batch.n_tokens()) * shape.n_heads * D;
  const size_t n_kv = static_cast<size_t>(batch.n_slots) * shape.n_kv_heads * D;
  const Tensor q = random_tensor(n_q, shape.dtype, q_amplitude, rng);
  const Tensor k = random_tensor(n_kv, shape.dtype, 1.0f, rng);
  const Tensor v = random_tensor(n_kv, shape.dtype, 1.0f, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  DevBuf d_q = upload(q.bytes);
  DevBuf d_k = upload(k.bytes);
  DevBuf d_v = upload(v.bytes);
  DevBuf d_token_start = upload(batch.token_start);
  DevBuf d_kv_len = upload(batch.kv_len);
  DevBuf d_slot_start = upload(batch.slot_start);
  DevBuf d_slot_table = upload(batch.slot_table);
  DevBuf d_prefill_ids = upload(work.prefill_ids);
  DevBuf d_decode_ids = upload(work.decode_ids);
  DevBuf d_out(n_q * elem);
  ASSERT_NE(d_out.get(), nullptr);
  LITELLAMA_ASSERT_CUDA(cudaMemset(d_out.get(), 0xFF, n_q * elem));  // NaN in every dtype

  if (!work.prefill_ids.empty()) {
    int32_t max_n_new = 0;
    for (int32_t s : work.prefill_ids) max_n_new = std::max(max_n_new, batch.seqs[s].n_new);
    LITELLAMA_ASSERT_OK(launch_attention_prefill(
        AttentionTensors<void>{d_out.get(), d_q.get(), d_k.get(), d_v.get(),
                               d_token_start.as<int32_t>(), d_kv_len.as<int32_t>(),
                               d_slot_start.as<int32_t>(), d_slot_table.as<int32_t>(),
                               d_prefill_ids.as<int32_t>()},
        static_cast<int32_t>(work.prefill_ids.size()), max_n_new, shape.n_heads, shape.n_kv_heads,
        D, shape.dtype, scale, nullptr));
  }
  if (!work.decode_ids.empty()) {
    int32_t n_sms = work.n_sms;
    if (n_sms == 0)
      LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0));
    int32_t max_kv_len = 0;
    for (int32_t s : work.decode_ids) max_kv_len = std::max(max_kv_len, batch.kv_len[s]);
    const int32_t n_work = static_cast<int32_t>(work.decode_ids.size());
    const size_t ws_bytes =
        work.decode_workspace_bytes != SIZE_MAX
            ? work.decode_workspace_bytes
            : attention_decode_workspace_size_bytes(n_work, shape.n_heads, shape.n_kv_heads, D,
                                                    max_kv_len, n_sms);
    DevBuf ws(ws_bytes);
    LITELLAMA_ASSERT_OK(launch_attention_decode(
        AttentionTensors<void>{d_out.get(), d_q.get(), d_k.get(), d_v.get(),
                               d_token_start.as<int32_t>(), d_kv_len.as<int32_t>(),
                               d_slot_start.as<int32_t>(), d_slot_table.as<int32_t>(),
                               d_decode_ids.as<int32_t>()},
        n_work, max_kv_len, shape.n_heads, shape.n_kv_heads, D, shape.dtype, scale, n_sms, ws.get(),
        ws_bytes, nullptr));
    LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());  // before ws goes out of scope
  }
  LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
  LITELLAMA_ASSERT_CUDA(cudaGetLastError());

  std::vector<uint8_t> out_bytes(n_q * elem);
  LITELLAMA_ASSERT_CUDA(
      cudaMemcpy(out_bytes.data(), d_out.get(), out_bytes.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(n_q);
  convert_to_f32(out.data(), out_bytes.data(), shape.dtype, n_q);

  // Reference, one sequence per task (disjoint rows).
  std::vector<int32_t> processed = work.prefill_ids;
  processed.insert(processed.end(), work.decode_ids.begin(), work.decode_ids.end());
  std::vector<float> ref(n_q, 0.0f);
  std::vector<std::future<Status>> tasks;
  for (int32_t s : processed) {
    tasks.push_back(std::async(std::launch::async, [&, s] {
      const int32_t ids[1] = {s};
      return attention_reference(ref.data(), q.values.data(), k.values.data(), v.values.data(),
                                 batch.token_start, batch.kv_len, batch.slot_start,
                                 batch.slot_table, ids, batch.n_slots, shape.n_heads,
                                 shape.n_kv_heads, D, scale);
    }));
  }
  for (auto& t : tasks) LITELLAMA_ASSERT_OK(t.get());

  std::vector<uint8_t> is_processed(batch.seqs.size(), 0);
  for (int32_t s : processed) is_processed[s] = 1;
  const double tol = tolerance(shape.dtype);
  double err_sq = 0.0;
  double ref_sq = 0.0;
  double worst_row = 0.0;
  int64_t n_bad_rows = 0;
  int64_t n_not_written = 0;
  int64_t n_touched = 0;
  const size_t row_bytes = static_cast<size_t>(D) * elem;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) {
      for (int32_t h = 0; h < shape.n_heads; ++h) {
        const size_t row = (static_cast<size_t>(t) * shape.n_heads + h) * D;
        if (!is_processed[s]) {
          const uint8_t* bytes = out_bytes.data() + row * elem;
          if (std::any_of(bytes, bytes + row_bytes, [](uint8_t x) { return x != 0xFF; })) {
            ++n_touched;
          }
          continue;
        }
        double row_err = 0.0;
        double row_ref = 0.0;
        bool finite = true;
        for (int32_t d = 0; d < D; ++d) {
          const double o = out[row + d];
          const double r = ref[row + d];
          if (!std::isfinite(o)) finite = false;
          row_err += (o - r) * (o - r);
          row_ref += r * r;
        }
        if (!finite) {
          ++n_not_written;
          continue;
        }
        err_sq += row_err;
        ref_sq += row_ref;
        const double rel = std::sqrt(row_err / std::max(row_ref, 1e-30));
        worst_row = std::max(worst_row, rel);
        if (rel > kRowToleranceFactor * tol) ++n_bad_rows;
      }
    }
  }
  const double rel = std::sqrt(err_sq / std::max(ref_sq, 1e-30));
  std::printf("[ %s ] %s d%d heads %d/%d: rel err %.3g, worst row %.3g (tol %.1g)\n", label.c_str(),
              dtype_label(shape.dtype), D, shape.n_heads, shape.n_kv_heads, rel, worst_row, tol);
  EXPECT_EQ(n_not_written, 0) << label << ": rows not written or not finite";
  EXPECT_EQ(n_touched, 0) << label << ": rows of sequences outside seq_ids were written";
  EXPECT_LE(rel, tol) << label;
  EXPECT_EQ(n_bad_rows, 0) << label << ": rows over " << kRowToleranceFactor * tol << ", worst "
                           << worst_row;
}

std::vector<int32_t> all_ids(size_t n, std::mt19937& rng) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

class AttentionTest : public ::testing::TestWithParam<std::tuple<DType, int32_t>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  int32_t head_dim() const { return std::get<1>(GetParam()); }
  Shape shape(int32_t n_heads, int32_t n_kv_heads) const {
    return Shape{dtype(), head_dim(), n_heads, n_kv_heads};
  }
};

TEST_P(AttentionTest, PrefillSmall) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(11);
  const Batch batch = make_batch({{1, 0}, {3, 0}, {7, 5}, {19, 1}, {1, 300}, {3, 60}, {2, 0}}, rng);
  Work work;
  work.prefill_ids = all_ids(batch.seqs.size(), rng);
  for (auto [h, kv] : {std::pair{8, 2}, std::pair{14, 2}, std::pair{4, 4}}) {
    run_and_check(shape(h, kv), batch, work, 2.0f, 101 + h, "prefill small");
  }
}

TEST_P(AttentionTest, DecodeSmall) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(12);
  const Batch batch =
      make_batch({{1, 0}, {1, 1}, {1, 4}, {1, 62}, {1, 63}, {1, 64}, {1, 299}, {1, 130}}, rng);
  for (int32_t n_sms : {1, 132}) {  // one split; many splits
    Work work;
    work.decode_ids = all_ids(batch.seqs.size(), rng);
    work.n_sms = n_sms;
    for (auto [h, kv] : {std::pair{8, 2}, std::pair{40, 2}}) {
      run_and_check(shape(h, kv), batch, work, 2.0f, 201 + h + n_sms,
                    "decode small, n_sms " + std::to_string(n_sms));
    }
  }
}

// One sequence: at head_dim 128 its CTAs take a smaller shared-memory carveout than a batch's
// (attention_decode.cu, tc_carveout_percent). Its lengths plan one split (1 and 64 keys), one
// cluster of splits (513) and more splits than a cluster, merged by the separate kernel (4100).
TEST_P(AttentionTest, DecodeOneSequence) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(14);
  for (int32_t len : {1, 64, 513, 4100}) {
    const Batch batch = make_batch({{1, len - 1}}, rng);
    Work work;
    work.decode_ids = {0};
    for (auto [h, kv] : {std::pair{32, 8}, std::pair{12, 2}}) {
      run_and_check(shape(h, kv), batch, work, 4.0f, 701 + len + h,
                    "decode one sequence of " + std::to_string(len));
    }
  }
}

TEST_P(AttentionTest, DecodeSmallWorkspaceShort) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  // A workspace sized for a shorter max_kv_len (or none) means fewer splits, never another result.
  std::mt19937 rng(14);
  const Batch batch = make_batch({{1, 2999}, {1, 40}, {1, 700}}, rng);
  const Shape s = shape(32, 8);
  const size_t short_ws =
      attention_decode_workspace_size_bytes(3, s.n_heads, s.n_kv_heads, s.head_dim, 200, 132);
  for (size_t ws_bytes : {size_t{0}, short_ws}) {
    Work work;
    work.decode_ids = all_ids(batch.seqs.size(), rng);
    work.n_sms = 132;
    work.decode_workspace_bytes = ws_bytes;
    run_and_check(s, batch, work, 4.0f, 251, "decode small, workspace " + std::to_string(ws_bytes));
  }
}

TEST_P(AttentionTest, MixedBatchSmall) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(13);
  // Prefill chunks (with and without cached prefix) and decode tokens in one packed step; the
  // sequence at index 4 is in neither list and must stay untouched.
  const Batch batch =
      make_batch({{1, 40}, {7, 0}, {1, 3}, {19, 5}, {3, 0}, {1, 200}, {5, 1}, {1, 0}}, rng);
  Work work;
  work.prefill_ids = {6, 3, 1};
  work.decode_ids = {5, 0, 7, 2};
  run_and_check(shape(16, 2), batch, work, 2.0f, 301, "mixed small");
}

TEST_P(AttentionTest, PrefillRealistic) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(21);
  const Batch batch = make_batch(
      {{733, 300}, {133, 0}, {19, 1}, {7, 5}, {3, 4097}, {1, 4099}, {1, 0}, {57, 0}}, rng);
  Work work;
  work.prefill_ids = all_ids(batch.seqs.size(), rng);
  work.prefill_ids.erase(std::find(work.prefill_ids.begin(), work.prefill_ids.end(), 7));
  for (auto [h, kv] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{8, 1}}) {
    run_and_check(shape(h, kv), batch, work, 4.0f, 401 + h * 10 + kv, "prefill realistic");
  }
}

TEST_P(AttentionTest, DecodeRealistic) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(22);
  std::vector<SeqSpec> seqs;
  for (int32_t len : {4100, 1, 17, 64, 300, 1000, 2047, 4096, 511, 129})
    seqs.push_back({1, len - 1});
  const Batch batch = make_batch(seqs, rng);
  Work work;
  work.decode_ids = all_ids(batch.seqs.size(), rng);
  work.decode_ids.erase(std::find(work.decode_ids.begin(), work.decode_ids.end(), 3));
  int32_t n_sms = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0));
  const auto n_work = static_cast<int32_t>(work.decode_ids.size());
  int32_t cluster_merges = 0;
  int32_t kernel_merges = 0;
  // (8, 1) plans about 30 splits: past the cluster-of-8 rewrite of 9 to 16, so it merges in the
  // separate kernel; (16, 2) and (32, 2) plan 15, which become one cluster of 8 where clusters
  // merge.
  for (auto [h, kv] : {std::pair{4, 4}, std::pair{32, 8}, std::pair{16, 2}, std::pair{28, 4},
                       std::pair{32, 2}, std::pair{8, 1}}) {
    const int32_t splits = attention_decode_launch_splits(
        attention_decode_n_splits(n_work, h, kv, head_dim(), 4100, n_sms), dtype());
    if (splits > 1) {
      ++(attention_decode_merges_in_cluster(splits, dtype()) ? cluster_merges : kernel_merges);
    }
    run_and_check(shape(h, kv), batch, work, 4.0f, 501 + h * 10 + kv,
                  "decode realistic, " + std::to_string(splits) + " splits");
  }
  // On a device with clusters, half-precision shapes exercise both ways of merging the splits.
  int major = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (!attention_decode_tuned(head_dim())) {
    // The general path plans no splits.
    EXPECT_EQ(cluster_merges + kernel_merges, 0);
  } else if (major >= 9 && dtype() != DType::kF32 && n_sms >= 100) {
    EXPECT_GT(cluster_merges, 0);
    EXPECT_GT(kernel_merges, 0);
    // Plans just past a cluster's worth run as one cluster of 8; longer ones keep their splits.
    EXPECT_EQ(attention_decode_launch_splits(9, dtype()), 8);
    EXPECT_EQ(attention_decode_launch_splits(16, dtype()), 8);
    EXPECT_EQ(attention_decode_launch_splits(17, dtype()), 17);
    EXPECT_EQ(attention_decode_launch_splits(5, dtype()), 5);
  } else if (dtype() == DType::kF32) {
    EXPECT_EQ(cluster_merges, 0);
    EXPECT_EQ(attention_decode_launch_splits(9, dtype()), 9);
  }
}

TEST_P(AttentionTest, DecodeAgreesWithPrefill) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  // The same decode sequences through the prefill kernel (n_new == 1 is a valid prefill).
  std::mt19937 rng(23);
  const Batch batch = make_batch({{1, 4099}, {1, 0}, {1, 777}, {1, 63}}, rng);
  Work work;
  work.prefill_ids = all_ids(batch.seqs.size(), rng);
  run_and_check(shape(32, 8), batch, work, 4.0f, 601, "prefill of decode tokens");
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, int32_t>>& info) {
  return std::string(dtype_label(std::get<0>(info.param))) + "_d" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16),
                                            ::testing::Values(16, 32, 48, 64, 80, 96, 128, 256)),
                         param_name);

TEST(AttentionSupport, RefusesUnsupportedShapes) {
  for (int32_t head_dim : {0, 257, 320, 512}) {
    EXPECT_FALSE(attention_prefill_supports(DType::kBF16, head_dim, 32, 8));
    EXPECT_FALSE(attention_decode_supports(DType::kBF16, head_dim, 32, 8));
    const Status p = launch_attention_prefill(AttentionTensors<void>{}, 1, 1, 32, 8, head_dim,
                                              DType::kBF16, 0.1f, nullptr);
    EXPECT_EQ(p.code(), StatusCode::kUnsupported);
    const Status d = launch_attention_decode(AttentionTensors<void>{}, 1, 1, 32, 8, head_dim,
                                             DType::kBF16, 0.1f, 132, nullptr, 0, nullptr);
    EXPECT_EQ(d.code(), StatusCode::kUnsupported);
  }
  EXPECT_FALSE(attention_prefill_supports(DType::kI32, 128, 32, 8));
  EXPECT_FALSE(attention_decode_supports(DType::kBF16, 128, 30, 8));  // not a multiple
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int32_t head_dim : {16, 32, 48, 64, 80, 96, 128, 256}) {
      EXPECT_TRUE(attention_prefill_supports(dtype, head_dim, 32, 8));
      EXPECT_TRUE(attention_decode_supports(dtype, head_dim, 32, 8));
      EXPECT_TRUE(attention_decode_supports(dtype, head_dim, 21, 3));  // group of 7
    }
  }
  // Portable builds compile no tuned kernel: every head size takes the general path.
  EXPECT_EQ(attention_decode_tuned(64), !LITELLAMA_PORTABLE_KERNELS);
  EXPECT_EQ(attention_prefill_tuned(128), !LITELLAMA_PORTABLE_KERNELS);
  EXPECT_FALSE(attention_decode_tuned(96));
  EXPECT_FALSE(attention_prefill_tuned(256));
}

// Head sizes off the tuned kernels plan one split and need no workspace.
TEST(AttentionSupport, GeneralPathPlansNoSplits) {
  for (int32_t head_dim : {16, 48, 80, 96, 256}) {
    EXPECT_EQ(attention_decode_n_splits(1, 32, 8, head_dim, 8192, 132), 1);
    EXPECT_EQ(attention_decode_workspace_size_bytes(256, 32, 8, head_dim, 8192, 132), 0u);
  }
}

TEST(AttentionSupport, DecodeSplitPlanAndWorkspace) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the split-K decode attention");
  // Small batches split long sequences; large batches split only against wave quantization, and
  // not short sequences; the workspace bound covers every n_work and max_kv_len up to its own.
  EXPECT_GT(attention_decode_n_splits(1, 32, 8, 64, 4096, 132), 1);
  EXPECT_EQ(attention_decode_n_splits(64, 32, 8, 64, 512, 132), 1);
  EXPECT_EQ(attention_decode_n_splits(1, 32, 8, 64, 10, 132), 1);
  for (int32_t head_dim : {64, 128}) {
    const size_t ws = attention_decode_workspace_size_bytes(256, 32, 8, head_dim, 8192, 132);
    for (int32_t n = 1; n <= 256; ++n) {
      for (int32_t kv : {1, 64, 65, 1000, 2048, 3000, 4096, 5000, 8192}) {
        const int32_t splits = attention_decode_n_splits(n, 32, 8, head_dim, kv, 132);
        const size_t need =
            splits > 1 ? static_cast<size_t>(n) * splits * 32 * (head_dim + 1) * 4 : 0;
        EXPECT_GE(ws, need) << n << " " << kv;
      }
    }
  }
}

// ---- timing ------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written), the ceiling the decode numbers compare
// with.
double copy_bandwidth_gbs() {
  const size_t bytes = size_t{1} << 30;
  DevBuf a(bytes);
  DevBuf b(bytes);
  if (a.get() == nullptr || b.get() == nullptr) return 0.0;
  cudaEvent_t start;
  cudaEvent_t stop;
  (void)cudaEventCreate(&start);
  (void)cudaEventCreate(&stop);
  (void)cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) {
    (void)cudaEventRecord(start);
    (void)cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
    (void)cudaEventRecord(stop);
    (void)cudaEventSynchronize(stop);
    float t = 0.0f;
    (void)cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

// Median microseconds per call of call(i % n_rot, stream), timed with CUDA events over graph
// replays of calls_per_sample calls (launch gaps as in the server's decode graphs).
void time_calls(const std::function<Status(int32_t, cudaStream_t)>& call, int32_t n_rot,
                int32_t calls_per_sample, double* us_per_call) {
  cudaStream_t stream;
  LITELLAMA_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int32_t r = 0; r < n_rot; ++r) LITELLAMA_ASSERT_OK(call(r, stream));
  LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LITELLAMA_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int32_t i = 0; i < calls_per_sample; ++i) LITELLAMA_ASSERT_OK(call(i % n_rot, stream));
  LITELLAMA_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  LITELLAMA_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  LITELLAMA_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  LITELLAMA_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start;
  cudaEvent_t stop;
  LITELLAMA_ASSERT_CUDA(cudaEventCreate(&start));
  LITELLAMA_ASSERT_CUDA(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int rep = 0; rep < 15; ++rep) {
    LITELLAMA_ASSERT_CUDA(cudaEventRecord(start, stream));
    LITELLAMA_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    LITELLAMA_ASSERT_CUDA(cudaEventRecord(stop, stream));
    LITELLAMA_ASSERT_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    LITELLAMA_ASSERT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1e3 * ms / calls_per_sample);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
  *us_per_call = median(us);
}

TEST(AttentionTiming, DecodeBf16HeadDim64) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the tuned attention");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const int32_t n_heads = 32;
  const int32_t n_kv_heads = 8;
  const int32_t D = 64;
  const DType dtype = DType::kBF16;
  int32_t n_sms = 0;
  LITELLAMA_ASSERT_CUDA(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  LITELLAMA_ASSERT_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("[ timing ] %s, %d SMs, L2 %d MB; device copy %.0f GB/s (read + write)\n", prop.name,
              n_sms, prop.l2CacheSize >> 20, copy_gbs);
  std::mt19937 rng(7);
  constexpr size_t kPoolSliceElems = size_t{1} << 24;
  const Tensor pool_slice = random_tensor(kPoolSliceElems, dtype, 1.0f, rng);
  for (bool shuffled : {true, false}) {
    for (int32_t batch_size : {1, 64}) {
      for (int32_t kv : {512, 4096}) {
        // Rotate over enough disjoint slot sets that one pass is well past the L2.
        const size_t kv_bytes_per_call =
            static_cast<size_t>(batch_size) * kv * n_kv_heads * D * 2 * dtype_size_bytes(dtype);
        const int32_t n_rot = static_cast<int32_t>(
            std::clamp<size_t>((size_t{512} << 20) / kv_bytes_per_call, 1, 256));
        const int32_t slots_per_call = batch_size * kv;
        const int32_t n_slots = slots_per_call * n_rot;
        std::vector<int32_t> perm(n_slots);
        std::iota(perm.begin(), perm.end(), 0);
        if (shuffled) std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<int32_t> token_start(batch_size + 1);
        std::vector<int32_t> kv_len(batch_size, kv);
        std::vector<int32_t> slot_start(batch_size + 1);
        std::vector<int32_t> seq_ids(batch_size);
        for (int32_t s = 0; s <= batch_size; ++s) {
          token_start[s] = s;
          slot_start[s] = s * kv;
        }
        std::iota(seq_ids.begin(), seq_ids.end(), 0);
        std::vector<DevBuf> tables;
        for (int32_t r = 0; r < n_rot; ++r) {
          tables.push_back(upload(std::vector<int32_t>(perm.begin() + r * slots_per_call,
                                                       perm.begin() + (r + 1) * slots_per_call)));
        }
        const size_t pool_elems = static_cast<size_t>(n_slots) * n_kv_heads * D;
        const Tensor qt =
            random_tensor(static_cast<size_t>(batch_size) * n_heads * D, dtype, 4.0f, rng);
        DevBuf d_q = upload(qt.bytes);
        DevBuf d_k(pool_elems * 2);
        DevBuf d_v(pool_elems * 2);
        // Random pool contents (not zeros): one random slice repeated over the pool.
        for (size_t off = 0; off < pool_elems; off += kPoolSliceElems) {
          const size_t n = std::min(kPoolSliceElems, pool_elems - off);
          LITELLAMA_ASSERT_CUDA(cudaMemcpy(d_k.as<uint8_t>() + off * 2, pool_slice.bytes.data(),
                                           n * 2, cudaMemcpyHostToDevice));
          LITELLAMA_ASSERT_CUDA(cudaMemcpy(d_v.as<uint8_t>() + off * 2,
                                           pool_slice.bytes.data() + 2 * kPoolSliceElems - n * 2,
                                           n * 2, cudaMemcpyHostToDevice));
        }
        DevBuf d_token_start = upload(token_start);
        DevBuf d_kv_len = upload(kv_len);
        DevBuf d_slot_start = upload(slot_start);
        DevBuf d_seq_ids = upload(seq_ids);
        DevBuf d_out(static_cast<size_t>(batch_size) * n_heads * D * 2);
        // The split plan for this device first; then, for shuffled slots, larger plans (as for a
        // device with more multiprocessors) to show how the split count moves the time.
        constexpr int32_t kMaxSmFactor = 8;
        const size_t ws_bytes = attention_decode_workspace_size_bytes(
            batch_size, n_heads, n_kv_heads, D, kv, n_sms * kMaxSmFactor);
        DevBuf ws(ws_bytes);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        int32_t last_splits = 0;
        for (int32_t factor = 1; factor <= (shuffled ? kMaxSmFactor : 1); factor *= 2) {
          const int32_t plan_sms = n_sms * factor;
          const int32_t splits =
              attention_decode_n_splits(batch_size, n_heads, n_kv_heads, D, kv, plan_sms);
          if (splits == last_splits) continue;
          last_splits = splits;
          auto call = [&](int32_t r, cudaStream_t stream) {
            return launch_attention_decode(
                AttentionTensors<void>{d_out.get(), d_q.get(), d_k.get(), d_v.get(),
                                       d_token_start.as<int32_t>(), d_kv_len.as<int32_t>(),
                                       d_slot_start.as<int32_t>(), tables[r].as<int32_t>(),
                                       d_seq_ids.as<int32_t>()},
                batch_size, kv, n_heads, n_kv_heads, D, dtype, scale, plan_sms, ws.get(), ws_bytes,
                stream);
          };
          const int32_t calls_per_sample = std::max(n_rot, 16);
          double t_us = 0.0;
          ASSERT_NO_FATAL_FAILURE(time_calls(call, n_rot, calls_per_sample, &t_us));
          const double bytes = static_cast<double>(kv_bytes_per_call) +
                               static_cast<double>(batch_size) * kv * sizeof(int32_t) +
                               2.0 * batch_size * n_heads * D * 2;
          const double gbs = bytes / (t_us * 1e-6) / 1e9;
          std::printf(
              "[ timing ] decode bf16 d64 heads 32/8 batch %2d kv %4d (%s slots): %8.2f us, "
              "%6.0f GB/s (%4.1f%% of copy), splits %d%s\n",
              batch_size, kv, shuffled ? "shuffled" : "contiguous", t_us, gbs,
              copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0, splits,
              factor == 1 ? " (this device's plan)" : "");
        }
      }
    }
  }
}

TEST(AttentionTiming, PrefillBf16HeadDim128) {
  LITELLAMA_SKIP_IN_PORTABLE_BUILD("the tuned attention");
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  const int32_t n_heads = 32;
  const int32_t n_kv_heads = 8;
  const int32_t D = 128;
  const int32_t n = 4096;
  const DType dtype = DType::kBF16;
  std::mt19937 rng(8);
  const Batch batch = make_batch({{n, 0}}, rng);
  const Tensor q = random_tensor(static_cast<size_t>(n) * n_heads * D, dtype, 4.0f, rng);
  const Tensor kv =
      random_tensor(static_cast<size_t>(batch.n_slots) * n_kv_heads * D, dtype, 1.0f, rng);
  DevBuf d_q = upload(q.bytes);
  DevBuf d_k = upload(kv.bytes);
  DevBuf d_v = upload(kv.bytes);
  DevBuf d_token_start = upload(batch.token_start);
  DevBuf d_kv_len = upload(batch.kv_len);
  DevBuf d_slot_start = upload(batch.slot_start);
  DevBuf d_slot_table = upload(batch.slot_table);
  DevBuf d_ids = upload(std::vector<int32_t>{0});
  DevBuf d_out(q.bytes.size());
  auto call = [&] {
    return launch_attention_prefill(
        AttentionTensors<void>{d_out.get(), d_q.get(), d_k.get(), d_v.get(),
                               d_token_start.as<int32_t>(), d_kv_len.as<int32_t>(),
                               d_slot_start.as<int32_t>(), d_slot_table.as<int32_t>(),
                               d_ids.as<int32_t>()},
        1, n, n_heads, n_kv_heads, D, dtype, 1.0f / std::sqrt(static_cast<float>(D)), nullptr);
  };
  LITELLAMA_ASSERT_OK(call());
  LITELLAMA_ASSERT_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start;
  cudaEvent_t stop;
  LITELLAMA_ASSERT_CUDA(cudaEventCreate(&start));
  LITELLAMA_ASSERT_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int rep = 0; rep < 9; ++rep) {
    LITELLAMA_ASSERT_CUDA(cudaEventRecord(start));
    LITELLAMA_ASSERT_OK(call());
    LITELLAMA_ASSERT_CUDA(cudaEventRecord(stop));
    LITELLAMA_ASSERT_CUDA(cudaEventSynchronize(stop));
    float t = 0.0f;
    LITELLAMA_ASSERT_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  const double t_ms = median(ms);
  const double flops = 4.0 * n_heads * D * (static_cast<double>(n) * (n + 1) / 2.0);
  std::printf(
      "[ timing ] prefill bf16 d128 heads 32/8, one sequence of %d tokens (shuffled "
      "slots): %.3f ms, %.0f TFLOP/s (causal FLOPs)\n",
      n, t_ms, flops / (t_ms * 1e-3) / 1e12);
}

}  // namespace
}  // namespace litellama
