// Split-K decode attention (FlashDecoding) over the token-attention KV pool.
//
// Grid: (split, sequence, KV head x head block). A CTA takes one contiguous key range of one
// sequence for one KV head and computes up to 16 query heads of that KV head's group at once, so
// the group shares every K/V byte read. The key range of split i is [i*chunk, (i+1)*chunk) with
// chunk = ceil(kv_len / n_splits) rounded up to whole tiles, computed on the device from the
// sequence's own kv_len: short sequences use fewer splits of the same grid and the result never
// depends on the host's max_kv_len hint. With n_splits == 1 the CTA writes the output directly.
// Split results are (normalized partial output, base-2 log-sum-exp) per (head, dimension), merged
// with weights 2^(lse_i - max lse):
//   - bf16/fp16 with 2 to kMaxClusterSplits splits on compute capability 9.0+: the splits of one
//     (sequence, KV head, head block) form one thread-block cluster. Each CTA leaves its result in
//     its own shared memory, the cluster synchronizes, and every CTA merges a share of the
//     (head, dimension) outputs by reading all of the cluster's results through distributed
//     shared memory: one kernel, no workspace, no global round trip, and no separate merge
//     launch per layer;
//   - otherwise the CTAs write their results to the workspace and attention_decode_merge_kernel
//     combines them.
//
// bf16/fp16: 4 warps, tiles of 64 keys gathered through the slot table with cp.async (16 bytes per
// thread, 2 tiles in flight ahead of the one being consumed), each warp takes 16 keys of a tile:
// S = Q K^T and O += P V as mma.sync m16n8k16 with the group's heads as the 16 rows (zero rows
// past the group), fp32 accumulators and a base-2 online softmax per warp; the 4 warps' states
// merge through shared memory at the end.
// float32: exact fp32 SIMT path (32 keys per step, expf, no TF32).
#include "kernels/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention_common.cuh"
#include "kernels/attention_decode_tc.cuh"
#include "kernels/attention_general.h"
#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
#if !LITELLAMA_PORTABLE_KERNELS

namespace {
// ---- fp32 SIMT kernel --------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_decode_f32_kernel(const DecodeParams<float> p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kAcc = kHeadsPerCta * D / kThreads;  // (head, dim) outputs per thread
  __shared__ __align__(16) float s_q[kHeadsPerCta][D];
  __shared__ float s_k[kF32Keys][D + 1];  // +1: lanes read different rows of one column
  __shared__ __align__(16) float s_v[kF32Keys][D];
  __shared__ float s_p[kHeadsPerCta][kF32Keys];
  __shared__ float s_m[kHeadsPerCta];
  __shared__ float s_l[kHeadsPerCta];
  __shared__ float s_corr[kHeadsPerCta];

  const auto [split, work, kvh, head0, n_rows, seq, token, kv_len, key_begin, key_end] =
      decode_cta(p);
  if (key_begin >= kv_len) return;
  const int32_t* slots = p.slot_table + p.slot_start[seq];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int c = threadIdx.x; c < kHeadsPerCta * D / 4; c += kThreads) {
    const int r = c / (D / 4);
    const int col = (c % (D / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows)
      v = *reinterpret_cast<const float4*>(p.q + (token * p.n_heads + head0 + r) * D + col);
    *reinterpret_cast<float4*>(&s_q[r][col]) = v;
  }
  if (threadIdx.x < kHeadsPerCta) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
  }
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int key0 = key_begin; key0 < key_end; key0 += kF32Keys) {
    __syncthreads();  // previous step's reads of s_k, s_v, s_p are done
    load_kv_step_f32<D, kF32Keys, kThreads>(s_k, s_v, p.k_pool, p.v_pool, slots, key0, key_end,
                                            p.n_kv_heads, kvh);
    __syncthreads();
    // Scores and the online-softmax update: warp w owns heads 4w..4w+3, lane = key.
#pragma unroll
    for (int rr = 0; rr < kHeadsPerCta / 4; ++rr) {
      const int r = warp * (kHeadsPerCta / 4) + rr;
      const float x = key0 + lane < key_end ? score_f32<D>(s_q, s_k, r, lane) * p.scale : -INFINITY;
      // Every row has a key in every step (key0 < key_end): its max is finite.
      online_softmax_step_f32<false>(x, lane, s_p[r], &s_corr[r], &s_m[r], &s_l[r]);
    }
    __syncthreads();
    accumulate_pv_f32<D, kThreads, kF32Keys>(acc, s_p, s_v, s_corr);
  }
  __syncthreads();  // s_m, s_l final
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / D;
    const int d = idx % D;
    if (r >= n_rows) continue;
    // The merge works in base 2: m (natural-base max of scaled scores) times log2(e).
    store_result<float, D>(p, work, split, head0 + r, token, d, acc[i], s_l[r], s_m[r] * kLog2e);
  }
}

// The splits of each (sequence, head) that hold keys (split_chunk decides how many).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_decode_merge_kernel(const DecodeParams<T> p, int n_work, int n_splits) {
  pdl_launch_dependents();
  pdl_wait();
  int work, head, d;
  if (!merge_thread<D>(n_work, p.n_heads, &work, &head, &d)) return;
  const int seq = p.seq_ids[work];
  const int kv_len = p.kv_len[seq];
  const int n_used = ceil_div(kv_len, split_chunk(kv_len, n_splits));
  const int64_t row0 = static_cast<int64_t>(work) * n_splits * p.n_heads + head;
  merge_parts<T, D>(p, row0, n_used,
                    p.out + (static_cast<int64_t>(p.token_start[seq]) * p.n_heads + head) * D, d);
}

// ---- launch ------------------------------------------------------------------------------------

int32_t n_head_blocks(int32_t n_heads, int32_t n_kv_heads) {
  const int32_t group = n_heads / n_kv_heads;
  return ceil_div<int32_t>(group, kHeadsPerCta);
}

size_t workspace_bytes_for(int32_t n_work, int32_t n_heads, int32_t head_dim, int32_t n_splits) {
  if (n_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(n_work) * n_splits * n_heads;
  return rows * (static_cast<size_t>(head_dim) + 1) * sizeof(float);
}

// Whether the cluster kernel runs as compiled for compute capability 9.0+: a build without sm_90
// code would run it from compute_80 PTX, where its body is a trap. Read once per process (from
// the device current at the first call).
bool cluster_kernel_available() {
  static const bool available = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, attention_decode_tc_kernel<gpu_bf16, 64, true, false>) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.ptxVersion >= 90;
  }();
  return available;
}

// Whether the splits merge inside one clustered launch (tensor-core path) rather than through
// the workspace and the merge kernel.
bool cluster_merges(int32_t n_splits, size_t elem_bytes) {
  return elem_bytes == 2 && n_splits >= 2 && n_splits <= kMaxClusterSplits &&
         current_device_supports_clusters() && cluster_kernel_available();
}

// Whether the tensor-core kernel loads its first K/V tiles before waiting for the previous kernel
// (the kEarly instantiation): at up to kEarlyKvMaxWork sequences the early loads overlap the QKV
// projection, larger batches keep the plain kernel. The two orders are two instantiations, not a
// runtime switch: a switch (and the skip test it puts in every tile load) slows the large batches
// whichever path runs.
constexpr int32_t kEarlyKvMaxWork = 8;
bool early_kv_loads(int32_t n_work) {
  return n_work <= kEarlyKvMaxWork;
}

// Shared memory the tensor-core kernel asks each multiprocessor for, in percent of the most
// (launch.h's LaunchShape); the rest is L1. The blocks that follow attention onto its
// multiprocessors without a pause (the o projection's GEMV, launched early) inherit attention's
// split, and the GEMVs need a large L1 for their loads in flight. The most shared memory fits two
// 128-wide CTAs and leaves 28 KB of L1. A single sequence with 128-wide heads asks for one CTA's
// worth (the 132 KB split): its CTAs spread one per multiprocessor and leave 124 KB of L1 beside
// them for the o projection. More sequences, and 64-wide heads, keep the most shared memory:
// there attention's own occupancy matters more than the L1 left to the next kernel
// (bench/RESULTS.md has the measurements).
int tc_carveout_percent(int32_t head_dim, int32_t n_work) {
  if (head_dim != 128 || n_work != 1) return cudaSharedmemCarveoutMaxShared;
  const int bytes =
      static_cast<int>(TcLayout<gpu_bf16, 128>::kSmemBytes) + kSmemPerCtaReservedBytes;
  return ceil_div(100 * bytes, kSmemPerSmBytes);
}

// CTAs of the tensor-core kernel resident per multiprocessor (shared memory bound) under the
// carveout of n_work sequences.
int32_t ctas_per_sm(int32_t head_dim, int32_t n_work) {
  const int smem_bytes = static_cast<int>(head_dim == 64 ? TcLayout<gpu_bf16, 64>::kSmemBytes
                                                         : TcLayout<gpu_bf16, 128>::kSmemBytes) +
                         kSmemPerCtaReservedBytes;
  const int shared = kSmemPerSmBytes * tc_carveout_percent(head_dim, n_work) / 100;
  return std::max(1, shared / smem_bytes);
}

struct LaunchArgs {
  AttentionArgs attention;
  int32_t n_splits;
  void* workspace;
  bool cluster;  // tensor-core path: merge the splits in a cluster (cluster_merges)
};

template <typename T, int D>
Status launch_typed(const LaunchArgs& la) {
  const AttentionArgs& a = la.attention;
  float* part_o = static_cast<float*>(la.workspace);
  float* part_lse = part_o == nullptr
                        ? nullptr
                        : part_o + static_cast<size_t>(a.n_work) * la.n_splits * a.n_heads * D;
  const int32_t blocks = n_head_blocks(a.n_heads, a.n_kv_heads);
  const DecodeParams<T> p{typed_tensors<T>(a.tensors), part_o, part_lse, a.n_heads, a.n_kv_heads,
                          a.n_heads / a.n_kv_heads,    blocks, a.scale};
  const dim3 grid(la.n_splits, a.n_work, a.n_kv_heads * blocks);
  if constexpr (std::is_same_v<T, float>) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(attention_decode_f32_kernel<D>, grid, dim3(kThreads), 0, a.stream, p));
  } else {
    using L = TcLayout<T, D>;
    const bool cluster = la.cluster;
    const bool early = early_kv_loads(a.n_work);
    auto* kernel = cluster ? (early ? attention_decode_tc_kernel<T, D, true, true>
                                    : attention_decode_tc_kernel<T, D, true, false>)
                           : (early ? attention_decode_tc_kernel<T, D, false, true>
                                    : attention_decode_tc_kernel<T, D, false, false>);
    LITELLAMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmemBytes)));
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             static_cast<int>(cudaSharedmemCarveoutMaxShared)));
    const LaunchShape shape{cluster ? static_cast<unsigned>(la.n_splits) : 0u,
                            tc_carveout_percent(D, a.n_work)};
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel_shaped(kernel, grid, dim3(kThreads), L::kSmemBytes, a.stream, shape, p));
    if (cluster) return Status::ok();
  }
  if (la.n_splits > 1) {
    constexpr int kHeadsPerBlock = kThreads / (D / 4);
    const int64_t n_rows = static_cast<int64_t>(a.n_work) * a.n_heads;
    const unsigned merge_blocks = static_cast<unsigned>(ceil_div<int64_t>(n_rows, kHeadsPerBlock));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(attention_decode_merge_kernel<T, D>,
                                                 dim3(merge_blocks), dim3(kThreads), 0, a.stream, p,
                                                 a.n_work, la.n_splits));
  }
  return Status::ok();
}

Status dispatch(const LaunchArgs& a, DType dtype, int32_t head_dim) {
  return dispatch_float_dtype(dtype, "attention_decode", [&](auto type) {
    using T = typename decltype(type)::type;
    return dispatch_tuned_head_dim(head_dim, "attention_decode",
                                   [&](auto d) { return launch_typed<T, decltype(d)::value>(a); });
  });
}

}  // namespace

bool attention_decode_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads) {
  return attention_shapes_supported(dtype, n_heads, n_kv_heads) &&
         (attention_decode_tuned(head_dim) ||
          attention_general_supports(dtype, head_dim, n_heads, n_kv_heads));
}

bool attention_decode_tuned(int32_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

int32_t attention_decode_n_splits(int32_t n_work, int32_t n_heads, int32_t n_kv_heads,
                                  int32_t head_dim, int32_t max_kv_len, int32_t n_sms) {
  if (n_work <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || max_kv_len <= 0 || n_sms <= 0 ||
      !attention_decode_tuned(head_dim)) {
    return 1;
  }
  const int64_t base =
      static_cast<int64_t>(n_work) * n_kv_heads * n_head_blocks(n_heads, n_kv_heads);
  const int64_t target = static_cast<int64_t>(kCtasPerSmTarget) * n_sms;
  if (base < target) {
    const int64_t want = ceil_div(target, base);
    const int64_t by_len = ceil_div<int64_t>(max_kv_len, kMinKeysPerSplit);
    return static_cast<int32_t>(std::clamp<int64_t>(std::min(want, by_len), 1, kMaxSplits));
  }
  // Cost in units of one unsplit CTA's time: waves of `slots` CTAs, each 1/s of the keys. A split
  // count is taken only when it saves at least a tenth over the best so far.
  const int64_t slots = static_cast<int64_t>(n_sms) * ctas_per_sm(head_dim, n_work);
  const int64_t max_s = std::min<int64_t>(kMaxWaveSplits, max_kv_len / kMinKeysPerWaveSplit);
  int64_t best_s = 1;
  double best_cost = static_cast<double>(ceil_div(base, slots));
  for (int64_t s = 2; s <= max_s; ++s) {
    const double cost = static_cast<double>(ceil_div(base * s, slots)) / static_cast<double>(s);
    if (cost < 0.9 * best_cost) {
      best_s = s;
      best_cost = cost;
    }
  }
  return static_cast<int32_t>(best_s);
}

int32_t attention_decode_launch_splits(int32_t n_splits, DType dtype) {
  // A context a little over 512 keys at batch 1 plans 9 splits of one tile, past the cluster size,
  // so its splits would merge in a separate kernel. Up to twice the cluster size, one cluster with
  // up to two tiles per CTA is used instead: it saves the merge launch and its workspace round
  // trip, which cost more than the longer CTAs.
  if (n_splits > kMaxClusterSplits && n_splits <= 2 * kMaxClusterSplits &&
      attention_decode_merges_in_cluster(kMaxClusterSplits, dtype)) {
    return kMaxClusterSplits;
  }
  return n_splits;
}

bool attention_decode_merges_in_cluster(int32_t n_splits, DType dtype) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) &&
         cluster_merges(n_splits, dtype_size_bytes(dtype));
}

size_t attention_decode_workspace_size_bytes(int32_t max_n_work, int32_t n_heads,
                                             int32_t n_kv_heads, int32_t head_dim,
                                             int32_t max_kv_len, int32_t n_sms) {
  if (max_n_work <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || max_kv_len <= 0 || n_sms <= 0 ||
      !attention_decode_tuned(head_dim)) {
    return 0;
  }
  // An upper bound of the plan over every max_kv_len up to the given one: each branch of
  // attention_decode_n_splits is bounded by its limits at the largest max_kv_len.
  const int64_t target = static_cast<int64_t>(kCtasPerSmTarget) * n_sms;
  const int64_t by_len = ceil_div<int64_t>(max_kv_len, kMinKeysPerSplit);
  const int64_t wave_max =
      std::max<int64_t>(1, std::min<int64_t>(kMaxWaveSplits, max_kv_len / kMinKeysPerWaveSplit));
  size_t bytes = 0;
  for (int32_t n = 1; n <= max_n_work; ++n) {
    const int64_t base = static_cast<int64_t>(n) * n_kv_heads * n_head_blocks(n_heads, n_kv_heads);
    const int64_t bound =
        base < target ? std::clamp<int64_t>(std::min(ceil_div(target, base), by_len), 1, kMaxSplits)
                      : wave_max;
    bytes = std::max(bytes, workspace_bytes_for(n, n_heads, head_dim, static_cast<int32_t>(bound)));
  }
  return bytes;
}

Status launch_attention_decode(const AttentionTensors<void>& tensors, int32_t n_work,
                               int32_t max_kv_len, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, DType dtype, float scale, int32_t n_sms,
                               void* workspace, size_t workspace_bytes, KernelStream stream) {
  const bool supported = attention_decode_supports(dtype, head_dim, n_heads, n_kv_heads);
  const int64_t grid_z =
      supported ? static_cast<int64_t>(n_kv_heads) * n_head_blocks(n_heads, n_kv_heads) : 0;
  LITELLAMA_RETURN_IF_ERROR(check_attention_launch("attention_decode", supported, dtype, head_dim,
                                                   n_heads, n_kv_heads, n_work, grid_z,
                                                   "heads {}/{}", n_heads, n_kv_heads));
  if (n_work == 0) return Status::ok();
  if (!attention_decode_tuned(head_dim)) {
    return launch_attention_general(tensors, n_work, /*max_n_new=*/1, n_heads, n_kv_heads, head_dim,
                                    dtype, scale, stream);
  }
  const int32_t n_splits = attention_decode_launch_splits(
      attention_decode_n_splits(n_work, n_heads, n_kv_heads, head_dim, max_kv_len, n_sms), dtype);
  LaunchArgs args{{tensors, n_work, n_heads, n_kv_heads, scale, stream},
                  n_splits,
                  workspace,
                  cluster_merges(n_splits, dtype_size_bytes(dtype))};
  if (args.cluster) {
    const Status clustered = dispatch(args, dtype, head_dim);
    if (clustered.is_ok()) return clustered;
    // A cluster launch the device refuses (too few free multiprocessors in one GPC, e.g. under
    // an MPS limit): merge through the workspace instead.
    (void)cudaGetLastError();
    args.cluster = false;
  }
  if (args.n_splits > 1) {
    // Fewer splits when the workspace holds fewer (a max_kv_len past what it was sized for): each
    // CTA derives its key range from the grid, so any split count gives the same result.
    const size_t per_split = workspace_bytes_for(n_work, n_heads, head_dim, 2) / 2;
    const bool aligned = workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0;
    const size_t fit = aligned ? workspace_bytes / per_split : 0;
    if (fit < static_cast<size_t>(args.n_splits)) {
      args.n_splits = fit >= 2 ? static_cast<int32_t>(fit) : 1;
    }
  }
  return dispatch(args, dtype, head_dim);
}

#else  // LITELLAMA_PORTABLE_KERNELS

// Portable builds (kernels/gpu_runtime.h) compile none of the tuned kernels above (tensor cores
// through inline PTX, thread-block clusters): every head size takes the general path, which plans
// no splits and needs no workspace.
bool attention_decode_supports(DType dtype, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads) {
  return attention_general_supports(dtype, head_dim, n_heads, n_kv_heads);
}

bool attention_decode_tuned(int32_t /*head_dim*/) {
  return false;
}

int32_t attention_decode_n_splits(int32_t /*n_work*/, int32_t /*n_heads*/, int32_t /*n_kv_heads*/,
                                  int32_t /*head_dim*/, int32_t /*max_kv_len*/, int32_t /*n_sms*/) {
  return 1;
}

int32_t attention_decode_launch_splits(int32_t n_splits, DType /*dtype*/) {
  return n_splits;
}

bool attention_decode_merges_in_cluster(int32_t /*n_splits*/, DType /*dtype*/) {
  return false;
}

size_t attention_decode_workspace_size_bytes(int32_t /*max_n_work*/, int32_t /*n_heads*/,
                                             int32_t /*n_kv_heads*/, int32_t /*head_dim*/,
                                             int32_t /*max_kv_len*/, int32_t /*n_sms*/) {
  return 0;
}

Status launch_attention_decode(const AttentionTensors<void>& tensors, int32_t n_work,
                               int32_t /*max_kv_len*/, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, DType dtype, float scale, int32_t /*n_sms*/,
                               void* /*workspace*/, size_t /*workspace_bytes*/,
                               KernelStream stream) {
  const bool supported = attention_decode_supports(dtype, head_dim, n_heads, n_kv_heads);
  LITELLAMA_RETURN_IF_ERROR(
      check_attention_launch("attention_decode", supported, dtype, head_dim, n_heads, n_kv_heads,
                             n_work, supported ? n_heads : 0, "heads {}/{}", n_heads, n_kv_heads));
  if (n_work == 0) return Status::ok();
  return launch_attention_general(tensors, n_work, /*max_n_new=*/1, n_heads, n_kv_heads, head_dim,
                                  dtype, scale, stream);
}

#endif

}  // namespace litellama
