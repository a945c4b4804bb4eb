// Device sampling: one 512-thread CTA per sampled row; every pass streams the row's logits (they
// stay in L2 between passes) as 16-byte loads, four in flight per thread. Prefix boundaries of the
// descending order are found by radix select over order-preserving 32-bit keys of the logits: four
// passes of a 256-bin histogram each (counts for top-k, probability mass for top-p and the draw),
// the bin that crosses the target chosen by one warp with a prefix scan over the bins in descending
// order.
#include "kernels/sampling.h"

#include <cfloat>
#include <climits>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr int kBinsPerLane = kBins / 32;
constexpr int32_t kPromptBit = 1 << 30;

// Order-preserving map of a float to uint32: a < b (as floats, no NaN) iff key(a) < key(b), and
// a == b iff key(a) == key(b): -0 takes the key of +0, as the CPU sampler's comparisons tie them.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// The float whose order_key is `key`.
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}

// The CPU sampler's generator (services/worker/cpu_sampler.cpp), bit for bit.
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ double sampling_uniform(uint64_t seed, int64_t n_generated) {
  const uint64_t r = mix64(mix64(seed) ^ mix64(static_cast<uint64_t>(n_generated) + 0x5851f42dull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

// Calls f(logit, id) for every logit of the row this thread owns: 16-byte loads, unrolled so
// several are in flight per thread (one row of a large vocabulary is ~0.5 MB per pass on one SM).
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* row, int vocab, F&& f) {
  if ((vocab & 3) == 0) {
    const auto* row4 = reinterpret_cast<const float4*>(row);
    const int n4 = vocab >> 2;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      const float4 v = row4[i];
      f(v.x, 4 * i);
      f(v.y, 4 * i + 1);
      f(v.z, 4 * i + 2);
      f(v.w, 4 * i + 3);
    }
  } else {
#pragma unroll 4
    for (int i = threadIdx.x; i < vocab; i += kThreads) f(row[i], i);
  }
}

struct ArgMax {
  float value;
  int32_t id;
};

// Descending value, then ascending id.
__device__ __forceinline__ bool better(const ArgMax& a, const ArgMax& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

struct Shared {
  ArgMax arg[kWarps];
  double sum_d[kWarps];
  uint32_t min_u[kWarps];
  int32_t count_i[kWarps];
  uint32_t bin_count[kBins];
  double bin_mass[kBins];
  // Result of the bin choice made by warp 0.
  int32_t chosen_bin;
  int32_t chosen_before_count;
  double chosen_before_mass;
};

__device__ ArgMax block_argmax(ArgMax x, Shared& sh) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    ArgMax o;
    o.value = __shfl_xor_sync(0xffffffffu, x.value, off);
    o.id = __shfl_xor_sync(0xffffffffu, x.id, off);
    if (better(o, x)) x = o;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.arg[threadIdx.x >> 5] = x;
  __syncthreads();
  ArgMax best = sh.arg[0];
  for (int w = 1; w < kWarps; ++w) {
    if (better(sh.arg[w], best)) best = sh.arg[w];
  }
  return best;
}

__device__ double block_sum(double x, Shared& sh) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.sum_d[threadIdx.x >> 5] = x;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.sum_d[w];
  return total;
}

__device__ int32_t block_count(int32_t x, Shared& sh) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.count_i[threadIdx.x >> 5] = x;
  __syncthreads();
  int32_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.count_i[w];
  return total;
}

__device__ uint32_t block_min(uint32_t x, Shared& sh) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.min_u[threadIdx.x >> 5] = x;
  __syncthreads();
  uint32_t m = sh.min_u[0];
  for (int w = 1; w < kWarps; ++w) m = min(m, sh.min_u[w]);
  return m;
}

// Run by warp 0 after a histogram pass. Visits the bins in descending order (lane l owns bins
// 255 - 8l .. 248 - 8l) and picks the first non-empty bin at which `before + value` reaches the
// target (by_mass: mass > target when strict, >= otherwise; else count >= target); when none does
// (rounding), the last non-empty bin. Writes the bin and what lies before it to `sh`.
__device__ void choose_bin(Shared& sh, bool by_mass, bool strict, double target_mass,
                           int32_t target_count, double before_mass0, int32_t before_count0) {
  const int lane = threadIdx.x & 31;
  double lane_mass = 0;
  int32_t lane_count = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerLane; ++j) {
    const int b = kBins - 1 - lane * kBinsPerLane - j;
    lane_mass += sh.bin_mass[b];
    lane_count += static_cast<int32_t>(sh.bin_count[b]);
  }
  // Inclusive scans over lanes in order.
  double incl_mass = lane_mass;
  int32_t incl_count = lane_count;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double m = __shfl_up_sync(0xffffffffu, incl_mass, off);
    const int32_t c = __shfl_up_sync(0xffffffffu, incl_count, off);
    if (lane >= off) {
      incl_mass += m;
      incl_count += c;
    }
  }
  double excl_mass = __shfl_up_sync(0xffffffffu, incl_mass, 1);
  int32_t excl_count = __shfl_up_sync(0xffffffffu, incl_count, 1);
  if (lane == 0) {
    excl_mass = 0;
    excl_count = 0;
  }
  auto crosses = [&](double mass, int32_t count) {
    if (!by_mass) return count >= target_count;
    return strict ? mass > target_mass : mass >= target_mass;
  };
  const bool lane_crosses =
      lane_count > 0 && crosses(before_mass0 + incl_mass, before_count0 + incl_count);
  const unsigned crossing = __ballot_sync(0xffffffffu, lane_crosses);
  const unsigned nonempty = __ballot_sync(0xffffffffu, lane_count > 0);
  // The first crossing lane, or else the last non-empty one.
  const int pick = crossing != 0 ? __ffs(crossing) - 1 : (nonempty != 0 ? 31 - __clz(nonempty) : 0);
  if (lane == pick) {
    double mass = before_mass0 + excl_mass;
    int32_t count = before_count0 + excl_count;
    int chosen = -1, last_nonempty = -1;
    double mass_at_last = mass;
    int32_t count_at_last = count;
    for (int j = 0; j < kBinsPerLane; ++j) {
      const int b = kBins - 1 - lane * kBinsPerLane - j;
      const int32_t c = static_cast<int32_t>(sh.bin_count[b]);
      if (c == 0) continue;
      if (crossing != 0 && crosses(mass + sh.bin_mass[b], count + c)) {
        chosen = b;
        break;
      }
      last_nonempty = b;
      mass_at_last = mass;
      count_at_last = count;
      mass += sh.bin_mass[b];
      count += c;
    }
    if (chosen < 0) {  // rounding left the scan short of the target: take the last element
      chosen = last_nonempty;
      mass = mass_at_last;
      count = count_at_last;
    }
    sh.chosen_bin = chosen;
    sh.chosen_before_mass = mass;
    sh.chosen_before_count = count;
  }
}

// The weight of a logit: exp(logit / T - max / T), as the CPU sampler computes it.
__device__ __forceinline__ double weight_of(float logit, double inv_t, double max_scaled) {
  return exp(static_cast<double>(logit) * inv_t - max_scaled);
}

// Radix select over keys >= min_key. by_mass: finds the key of the element at which the cumulative
// weight in descending order reaches target_mass; else the key of the target_count-th largest.
// Returns the key; *mass_above gets the weight of eligible elements with larger keys.
__device__ uint32_t radix_select(const float* logits, int vocab, uint32_t min_key, bool by_mass,
                                 bool strict, double target_mass, int32_t target_count,
                                 double inv_t, double max_scaled, Shared& sh, double* mass_above) {
  uint32_t prefix = 0, mask = 0;
  double before_mass = 0;
  int32_t before_count = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_count[b] = 0;
      sh.bin_mass[b] = 0;
    }
    __syncthreads();
    for_each_logit(logits, vocab, [&](float l, int) {
      const uint32_t key = order_key(l);
      if (key < min_key || (key & mask) != prefix) return;
      const int b = (key >> shift) & 0xff;
      atomicAdd(&sh.bin_count[b], 1u);
      if (by_mass) atomicAdd(&sh.bin_mass[b], weight_of(l, inv_t, max_scaled));
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      choose_bin(sh, by_mass, strict, target_mass, target_count, before_mass, before_count);
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.chosen_bin) << shift;
    mask |= 0xffu << shift;
    before_mass = sh.chosen_before_mass;
    before_count = sh.chosen_before_count;
    __syncthreads();
  }
  *mass_above = before_mass;
  return prefix;
}

__global__ void __launch_bounds__(kThreads, 1)
    sampling_kernel(int32_t* __restrict__ sampled_ids, int32_t* __restrict__ top_ids,
                    float* __restrict__ top_logits, float* __restrict__ logits_all,
                    const SamplingRow* __restrict__ rows, const int32_t* __restrict__ history_ids,
                    int vocab, int n_top, int32_t* __restrict__ token_marks) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ Shared sh;
  const int r = blockIdx.x;
  float* logits = logits_all + static_cast<int64_t>(r) * vocab;
  const SamplingRow p = rows[r];

  // Top-N raw logits: N argmax passes, each over what ranks below the previous winner.
  ArgMax prev{FLT_MAX, -1};
  bool prev_inf = true;
  for (int n = 0; n < n_top; ++n) {
    ArgMax best{-INFINITY, INT_MAX};
    for_each_logit(logits, vocab, [&](float l, int i) {
      const ArgMax c{l, i};
      if ((prev_inf || better(prev, c)) && better(c, best)) best = c;
    });
    best = block_argmax(best, sh);
    if (threadIdx.x == 0) {
      top_ids[static_cast<int64_t>(r) * n_top + n] = best.id;
      top_logits[static_cast<int64_t>(r) * n_top + n] = best.value;
    }
    prev = best;
    prev_inf = false;
  }

  // Penalties. Marks per vocab id: generated count in the low bits, kPromptBit when in the prompt;
  // the apply pass takes each mark with an exchange, so exactly one thread applies a given id and
  // the marks are left zero for the next step.
  const bool rep = p.repetition_penalty != 1.0f;
  const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (rep || freq) {
    int32_t* marks = token_marks + static_cast<int64_t>(r) * vocab;
    const int n_hist = p.history_end - p.history_begin;
    for (int j = threadIdx.x; j < n_hist; j += kThreads) {
      const int32_t id = history_ids[p.history_begin + j];
      if (j < p.n_prompt) {
        atomicOr(&marks[id], kPromptBit);
      } else {
        atomicAdd(&marks[id], 1);
      }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_hist; j += kThreads) {
      const int32_t id = history_ids[p.history_begin + j];
      const int32_t m = atomicExch(&marks[id], 0);
      if (m == 0) continue;
      const int32_t count = m & ~kPromptBit;
      float l = logits[id];
      if (rep) l = l > 0 ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
      if (freq && count > 0) {
        l = __fsub_rn(l, __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(count)),
                                   p.presence_penalty));
      }
      logits[id] = l;
    }
    __syncthreads();
  }

  ArgMax best{-INFINITY, INT_MAX};
  for_each_logit(logits, vocab, [&](float l, int i) {
    const ArgMax c{l, i};
    if (better(c, best)) best = c;
  });
  best = block_argmax(best, sh);
  if (p.temperature <= 0.0f) {
    if (threadIdx.x == 0) sampled_ids[r] = best.id;
    return;
  }

  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_scaled = static_cast<double>(best.value) * inv_t;
  double unused_mass;

  // Top-k: the k-th largest key; values tied with it survive.
  uint32_t min_key = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    min_key = radix_select(logits, vocab, 0, false, false, 0.0, p.top_k, inv_t, max_scaled, sh,
                           &unused_mass);
  }
  double total = 0;
  for_each_logit(logits, vocab, [&](float l, int) {
    if (order_key(l) >= min_key) total += weight_of(l, inv_t, max_scaled);
  });
  total = block_sum(total, sh);

  // Top-p: the element at which the cumulative probability first reaches top_p.
  uint32_t keep_key = min_key;
  if (p.top_p < 1.0f) {
    const uint32_t k =
        radix_select(logits, vocab, min_key, true, false, static_cast<double>(p.top_p) * total, 0,
                     inv_t, max_scaled, sh, &unused_mass);
    keep_key = max(keep_key, k);
  }
  // Min-p: probabilities >= min_p * the largest one (whose weight is exactly 1).
  if (p.min_p > 0.0f) {
    uint32_t k = UINT_MAX;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = logits[i];
      const uint32_t key = order_key(l);
      if (key >= keep_key &&
          weight_of(l, inv_t, max_scaled) / total >= static_cast<double>(p.min_p) * (1.0 / total)) {
        k = min(k, key);
      }
    }
    k = block_min(k, sh);
    keep_key = max(keep_key, k);
  }

  double kept = 0;
  for_each_logit(logits, vocab, [&](float l, int) {
    if (order_key(l) >= keep_key) kept += weight_of(l, inv_t, max_scaled);
  });
  kept = block_sum(kept, sh);
  const double u = sampling_uniform(p.seed, p.n_generated) * kept;
  double mass_above = 0;
  const uint32_t key =
      radix_select(logits, vocab, keep_key, true, true, u, 0, inv_t, max_scaled, sh, &mass_above);

  // Ties at the drawn key are walked by ascending id: take the r-th of them (r = 1 unless the
  // drawn key is shared).
  int32_t n_ties = 0;
  ArgMax first{-INFINITY, INT_MAX};
  for_each_logit(logits, vocab, [&](float l, int i) {
    if (order_key(l) != key) return;
    ++n_ties;
    if (i < first.id) first = ArgMax{0.0f, i};
  });
  n_ties = block_count(n_ties, sh);
  int32_t id = block_argmax(first, sh).id;
  if (n_ties > 1) {
    const double w = weight_of(key_value(key), inv_t, max_scaled);
    int32_t take = n_ties;
    double cum = mass_above;
    for (int32_t j = 1; j <= n_ties; ++j) {
      cum += w;
      if (u < cum) {
        take = j;
        break;
      }
    }
    for (int32_t j = 1; j < take; ++j) {
      const int32_t prev_id = id;
      ArgMax c{-INFINITY, INT_MAX};
      for_each_logit(logits, vocab, [&](float l, int i) {
        if (i > prev_id && i < c.id && order_key(l) == key) c = ArgMax{0.0f, i};
      });
      id = block_argmax(c, sh).id;
    }
  }
  if (threadIdx.x == 0) sampled_ids[r] = id;
}

}  // namespace

bool sampling_supports(int32_t vocab_size, int32_t n_top) {
  return vocab_size > 0 && n_top >= 0 && n_top <= kSamplingMaxTopLogits && n_top <= vocab_size;
}

size_t sampling_workspace_size_bytes(int32_t n_rows, int32_t vocab_size) {
  return static_cast<size_t>(n_rows) * static_cast<size_t>(vocab_size) * sizeof(int32_t);
}

Status launch_sampling(int32_t* sampled_ids, int32_t* top_ids, float* top_logits, float* logits,
                       const SamplingRow* rows, const int32_t* history_ids, int32_t n_rows,
                       int32_t vocab_size, int32_t n_top, int32_t* token_marks,
                       cudaStream_t stream) {
  if (!sampling_supports(vocab_size, n_top)) {
    return make_error(StatusCode::kUnsupported,
                      "sampling: n_top_logits {} exceeds {} (or the vocabulary of {})", n_top,
                      kSamplingMaxTopLogits, vocab_size);
  }
  if (n_rows == 0) return Status::ok();
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(sampling_kernel, dim3(n_rows), dim3(kThreads), 0,
                                               stream, sampled_ids, top_ids, top_logits, logits,
                                               rows, history_ids, vocab_size, n_top, token_marks));
  return Status::ok();
}

}  // namespace litellama
