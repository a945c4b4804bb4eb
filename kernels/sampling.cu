// Device sampling. A row is sampled by a group of 512-thread CTAs (RowGroup): one CTA, or a
// thread-block cluster of up to kMaxCtasPerRow CTAs each streaming a slice of the row (16-byte
// loads, four in flight per thread; the logits stay in L2 between passes). Reductions over the
// row go through each CTA's shared memory and, in a cluster, through distributed shared memory.
// Prefix boundaries of the descending order are found by radix select over order-preserving
// 32-bit keys of the logits: four passes of a 256-bin histogram each (counts for top-k,
// probability mass for top-p and the draw), the bin that crosses the target chosen by one warp
// with a prefix scan over the bins in descending order. Greedy-only launches use greedy_kernel: a
// packed (value, id) maximum per row through global atomics.
#include "kernels/sampling.h"

#if !LITELLAMA_PORTABLE_KERNELS
#include <cooperative_groups.h>
#endif

#include <algorithm>
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
constexpr int32_t kMaxCtasPerRow = 8;  // the portable cluster size
constexpr int32_t kMaxGreedyCtasPerRow = 16;
// Fixed-point histogram masses (histogram_add): a weight is at most 1, so kMassFracBits = 44
// leaves a row of up to 2^19 logits within 63 bits, and the high word of one CTA's sum (at most
// 2^12 + 1 per logit) within 32 bits.
constexpr int kMassFracBits = 44;
constexpr double kMassScale = static_cast<double>(1ull << kMassFracBits);
static_assert(kSamplingMaxVocab <= (1 << (63 - kMassFracBits)));

// A weight (0 <= w <= 1) in the masses' fixed point: a multiple of 2^-kMassFracBits. Every mass
// of a draw (histogram bins, the total, the kept mass) is a sum of these, so that a draw below
// the kept mass always lands in a bin: weights below 2^-45 are 0 and never drawn.
__device__ __forceinline__ unsigned long long mass_units(double w) {
  return __double2ull_rn(fmin(w, 1.0) * kMassScale);
}
__device__ __forceinline__ double quantized(double w) {
  return static_cast<double>(mass_units(w)) * (1.0 / kMassScale);
}

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

// The part of a row one CTA of its group streams: units [begin, end), a unit being a float4 of
// logits when the vocabulary is a multiple of 4 (vec), else one logit.
struct Slice {
  int begin;
  int end;
  bool vec;
  __device__ bool owns(int id) const {
    const int unit = vec ? id >> 2 : id;
    return unit >= begin && unit < end;
  }
};

__device__ __forceinline__ Slice slice_of(int vocab, int rank, int n_ctas) {
  const bool vec = (vocab & 3) == 0;
  const int units = vec ? vocab >> 2 : vocab;
  const int per = ceil_div(units, n_ctas);
  const int begin = min(units, rank * per);
  return Slice{begin, min(units, begin + per), vec};
}

// Calls f(logit, id) for every logit of the slice this thread owns: 16-byte loads, unrolled so
// several are in flight per thread.
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* row, const Slice& s, F&& f) {
  if (s.vec) {
    const auto* row4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
    for (int i = s.begin + static_cast<int>(threadIdx.x); i < s.end; i += kThreads) {
      const float4 v = row4[i];
      f(v.x, 4 * i);
      f(v.y, 4 * i + 1);
      f(v.z, 4 * i + 2);
      f(v.w, 4 * i + 3);
    }
  } else {
#pragma unroll 4
    for (int i = s.begin + static_cast<int>(threadIdx.x); i < s.end; i += kThreads) f(row[i], i);
  }
}

// The workspace holds, per row, in 32-bit words: the penalty marks (one per vocabulary id), then,
// 8-byte aligned, the greedy kernel's packed best logit (uint64) and its CTA ticket (uint32). All
// of it is zero at rest; the layout does not depend on the number of rows of a launch.
__host__ __device__ constexpr int64_t workspace_row_words(int vocab) {
  return (static_cast<int64_t>(vocab) + 1) / 2 * 2 + 4;
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
  // Block reductions.
  ArgMax arg[kWarps];
  double sum_d[kWarps];
  uint32_t min_u[kWarps];
  int32_t count_i[kWarps];
  // What each CTA offers its group's reductions, two of each so that consecutive reductions do
  // not overwrite what a slower CTA may still be reading (RowGroup::phase).
  ArgMax x_arg[2];
  double x_sum[2];
  uint32_t x_min[2];
  int32_t x_count[2];
  uint32_t hist_count[2][kBins];
  uint32_t hist_mass_lo[2][kBins];  // fixed point, see histogram_add
  uint32_t hist_mass_hi[2][kBins];
  // The group's histogram of the current pass, summed over its CTAs.
  uint32_t bin_count[kBins];
  double bin_mass[kBins];
  // The top-p selection's first-pass histogram, which the draw reuses (FirstPass).
  uint32_t first_count[kBins];
  double first_mass[kBins];
  // Result of the bin choice made by warp 0.
  int32_t chosen_bin;
  int32_t chosen_before_count;
  double chosen_before_mass;
  // Logprobs: the raw logit of the sampled id (see write_logprob).
  float chosen_raw;
};

// The CTAs that sample one row: one CTA, or (kCluster) a thread-block cluster whose CTAs each
// stream a slice of the row and meet in distributed shared memory. Every group reduction takes
// one cluster barrier; its values sit in the slot `phase` of each CTA's shared memory, and phase
// alternates, so a CTA rewrites a slot only after a later barrier that every reader of the slot's
// previous value has reached.
template <bool kCluster>
struct RowGroup {
  static_assert(!(kCluster && LITELLAMA_PORTABLE_KERNELS), "clusters are not portable");
  int rank;
  int size;
  int phase = 0;

  __device__ RowGroup(int rank_, int size_) : rank(rank_), size(size_) {}

  // Barrier of all threads of the group; at cluster scope it also orders global memory
  // (release/acquire).
  __device__ void sync() const {
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !LITELLAMA_PORTABLE_KERNELS
      cooperative_groups::this_cluster().sync();
#elif !LITELLAMA_PORTABLE_KERNELS
      __trap();  // launched only on compute capability 9.0+
#endif
    } else {
      __syncthreads();
    }
  }

  // `p` (in this CTA's shared memory) as CTA `r` of the group holds it.
  template <typename T>
  __device__ const T* peer(T* p, int r) const {
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !LITELLAMA_PORTABLE_KERNELS
      return cooperative_groups::this_cluster().map_shared_rank(p, r);
#elif !LITELLAMA_PORTABLE_KERNELS
      __trap();
#endif
    }
    return p;
  }

  // Combines the CTAs' values of one reduction, in rank order (every CTA gets the same result).
  template <typename T, typename Op>
  __device__ T reduce(T block_value, T (&slot)[2], Op op) {
    if constexpr (!kCluster) {
      return block_value;
    } else {
      if (threadIdx.x == 0) slot[phase] = block_value;
      sync();
      T v = *peer(&slot[phase], 0);
      for (int r = 1; r < size; ++r) v = op(v, *peer(&slot[phase], r));
      phase ^= 1;
      return v;
    }
  }
};

__device__ ArgMax block_argmax(ArgMax x, Shared& sh) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    ArgMax o;
    o.value = gpu_shfl_xor(x.value, off);
    o.id = gpu_shfl_xor(x.id, off);
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

// Reduces x over the block with op: each warp by shuffles, then the warps' values in warp order
// starting from `identity`, so the order of floating-point operations is fixed. Every thread
// gets the result.
template <typename T, typename Op>
__device__ T block_allreduce(T x, T identity, T (&scratch)[kWarps], Op op) {
  x = warp_allreduce(x, op);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  T total = identity;
  for (int w = 0; w < kWarps; ++w) total = op(total, scratch[w]);
  return total;
}

__device__ double block_sum(double x, Shared& sh) {
  return block_allreduce(x, 0.0, sh.sum_d, SumOp{});
}

__device__ int32_t block_count(int32_t x, Shared& sh) {
  return block_allreduce(x, int32_t{0}, sh.count_i, SumOp{});
}

__device__ uint32_t block_min(uint32_t x, Shared& sh) {
  return block_allreduce(x, UINT32_MAX, sh.min_u, MinOp{});
}

template <bool kCluster>
__device__ ArgMax row_argmax(ArgMax x, Shared& sh, RowGroup<kCluster>& g) {
  return g.reduce(block_argmax(x, sh), sh.x_arg,
                  [](ArgMax a, ArgMax b) { return better(b, a) ? b : a; });
}

template <bool kCluster>
__device__ double row_sum(double x, Shared& sh, RowGroup<kCluster>& g) {
  return g.reduce(block_sum(x, sh), sh.x_sum, [](double a, double b) { return a + b; });
}

template <bool kCluster>
__device__ int32_t row_count(int32_t x, Shared& sh, RowGroup<kCluster>& g) {
  return g.reduce(block_count(x, sh), sh.x_count, [](int32_t a, int32_t b) { return a + b; });
}

template <bool kCluster>
__device__ uint32_t row_min(uint32_t x, Shared& sh, RowGroup<kCluster>& g) {
  return g.reduce(block_min(x, sh), sh.x_min, [](uint32_t a, uint32_t b) { return min(a, b); });
}

// Adds one element of weight w (0 <= w <= 1) to bin b of a shared histogram. Shared-memory
// atomics are native only for 32-bit integers (float, double and 64-bit adds are compare-and-swap
// loops, which serialize where a radix pass puts most logits into a few bins, as the first pass of
// a large-vocabulary row does). So the mass is a 64-bit fixed-point
// number (kMassFracBits fraction bits) kept as two 32-bit words per bin: the low word's add
// returns the old value, and its carry goes to the high word with the high bits of w. Integer sums
// are also exact and independent of the order of the adds.
__device__ __forceinline__ void histogram_add(uint32_t* count, uint32_t* mass_lo, uint32_t* mass_hi,
                                              bool by_mass, int b, double w) {
  atomicAdd(&count[b], 1u);
  if (!by_mass) return;
  const unsigned long long q = mass_units(w);
  const auto lo = static_cast<uint32_t>(q);
  const uint32_t old = atomicAdd(&mass_lo[b], lo);
  const uint32_t hi = static_cast<uint32_t>(q >> 32) + (old > 0xffffffffu - lo ? 1u : 0u);
  if (hi != 0) atomicAdd(&mass_hi[b], hi);
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
    const double m = gpu_shfl_up(incl_mass, off);
    const int32_t c = gpu_shfl_up(incl_count, off);
    if (lane >= off) {
      incl_mass += m;
      incl_count += c;
    }
  }
  double excl_mass = gpu_shfl_up(incl_mass, 1);
  int32_t excl_count = gpu_shfl_up(incl_count, 1);
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
  const unsigned crossing = gpu_ballot(lane_crosses);
  const unsigned nonempty = gpu_ballot(lane_count > 0);
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

// How radix_select uses the group's first-pass histogram (sh.first_count / first_mass).
struct FirstPass {
  bool save = false;   // keep this selection's first-pass histogram there
  bool reuse = false;  // take the one kept there instead of streaming the row
  // With reuse: bins below this one hold no eligible key and are taken as empty. The kept
  // histogram must then be of a superset of this selection's eligible keys, every bin from
  // floor_bin up equal to this selection's except floor_bin itself, which may hold more: the
  // first non-empty bin at which the walk reaches the target (or the last non-empty one) is then
  // the same, and so is the mass before it.
  int floor_bin = 0;
};

// Radix select over keys >= min_key. by_mass: finds the key of the element at which the cumulative
// weight in descending order reaches target_mass; else the key of the target_count-th largest.
// Returns the key; *mass_above gets the weight of eligible elements with larger keys and, when
// given, *mass_at the weight of those with the returned key.
template <bool kCluster>
__device__ uint32_t radix_select(const float* logits, const Slice& slice, uint32_t min_key,
                                 bool by_mass, bool strict, double target_mass,
                                 int32_t target_count, double inv_t, double max_scaled, Shared& sh,
                                 RowGroup<kCluster>& g, double* mass_above,
                                 double* mass_at = nullptr, FirstPass first = FirstPass{}) {
  uint32_t prefix = 0, mask = 0;
  double before_mass = 0;
  int32_t before_count = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (shift == 24 && first.reuse) {
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        const bool below = b < first.floor_bin;
        sh.bin_count[b] = below ? 0u : sh.first_count[b];
        sh.bin_mass[b] = below ? 0.0 : sh.first_mass[b];
      }
    } else {
      uint32_t* count = sh.hist_count[g.phase];
      uint32_t* mass_lo = sh.hist_mass_lo[g.phase];
      uint32_t* mass_hi = sh.hist_mass_hi[g.phase];
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        count[b] = 0;
        mass_lo[b] = 0;
        mass_hi[b] = 0;
      }
      __syncthreads();
      for_each_logit(logits, slice, [&](float l, int) {
        const uint32_t key = order_key(l);
        if (key < min_key || (key & mask) != prefix) return;
        const double w = by_mass ? weight_of(l, inv_t, max_scaled) : 0.0;
        histogram_add(count, mass_lo, mass_hi, by_mass, static_cast<int>((key >> shift) & 0xff), w);
      });
      // The group's histogram, summed over its CTAs.
      g.sync();
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        uint32_t c = 0;
        unsigned long long m = 0;
        for (int r = 0; r < g.size; ++r) {
          c += *g.peer(&count[b], r);
          m += (static_cast<unsigned long long>(*g.peer(&mass_hi[b], r)) << 32) +
               *g.peer(&mass_lo[b], r);
        }
        sh.bin_count[b] = c;
        sh.bin_mass[b] = static_cast<double>(m) * (1.0 / kMassScale);
        if (shift == 24 && first.save) {
          sh.first_count[b] = c;
          sh.first_mass[b] = sh.bin_mass[b];
        }
      }
      g.phase ^= 1;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      choose_bin(sh, by_mass, strict, target_mass, target_count, before_mass, before_count);
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.chosen_bin) << shift;
    mask |= 0xffu << shift;
    before_mass = sh.chosen_before_mass;
    before_count = sh.chosen_before_count;
    if (shift == 0 && mass_at != nullptr) *mass_at = sh.bin_mass[sh.chosen_bin];
    __syncthreads();
  }
  *mass_above = before_mass;
  return prefix;
}

// Samples row `r`; every thread of the group returns the token. The group's rank-0 CTA writes the
// top-N logits.
template <bool kCluster>
__device__ int32_t sample_row(int r, int32_t* __restrict__ top_ids, float* __restrict__ top_logits,
                              float* __restrict__ logits_all, const SamplingRow* __restrict__ rows,
                              const int32_t* __restrict__ history_ids, int vocab, int n_top,
                              int32_t* __restrict__ token_marks, const SamplingLogprobs& lp,
                              Shared& sh, RowGroup<kCluster>& g) {
  float* logits = logits_all + static_cast<int64_t>(r) * vocab;
  const SamplingRow row = rows[r];
  const SamplingParams& p = row.params;
  const Slice slice = slice_of(vocab, g.rank, g.size);
  const bool writer = g.rank == 0 && threadIdx.x == 0;
  const bool want_logprobs = lp.logprobs != nullptr;

  // Log-sum-exp of the raw logits (before penalties), in fp32: the maximum, then the sum of
  // exp(logit - max), whose per-thread parts are added up in double.
  float lse = 0.0f;
  if (want_logprobs) {
    ArgMax m{-INFINITY, INT_MAX};
    for_each_logit(logits, slice, [&](float l, int i) {
      const ArgMax c{l, i};
      if (better(c, m)) m = c;
    });
    m = row_argmax(m, sh, g);
    float part = 0.0f;
    for_each_logit(logits, slice, [&](float l, int) { part += expf(l - m.value); });
    const double total = row_sum(static_cast<double>(part), sh, g);
    lse = m.value + logf(static_cast<float>(total));
  }

  // Top-N raw logits: N argmax passes, each over what ranks below the previous winner.
  ArgMax prev{FLT_MAX, -1};
  bool prev_inf = true;
  for (int n = 0; n < n_top; ++n) {
    ArgMax best{-INFINITY, INT_MAX};
    for_each_logit(logits, slice, [&](float l, int i) {
      const ArgMax c{l, i};
      if ((prev_inf || better(prev, c)) && better(c, best)) best = c;
    });
    best = row_argmax(best, sh, g);
    if (writer) {
      top_ids[static_cast<int64_t>(r) * n_top + n] = best.id;
      top_logits[static_cast<int64_t>(r) * n_top + n] = best.value;
    }
    prev = best;
    prev_inf = false;
  }

  // Penalties. Marks per vocab id: generated count in the low bits, kPromptBit when in the prompt;
  // the group's CTAs mark a share of the history each, then each applies the ids of its own slice
  // (so that a CTA reads no logit another one wrote), taking each mark with an exchange: exactly
  // one thread applies a given id and the marks are left zero for the next step.
  const bool rep = p.repetition_penalty != 1.0f;
  const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (rep || freq) {
    int32_t* marks = token_marks + static_cast<int64_t>(r) * workspace_row_words(vocab);
    const int n_hist = row.history_end - row.history_begin;
    for (int j = g.rank * kThreads + threadIdx.x; j < n_hist; j += g.size * kThreads) {
      const int32_t id = history_ids[row.history_begin + j];
      if (j < row.n_prompt) {
        atomicOr(&marks[id], kPromptBit);
      } else {
        atomicAdd(&marks[id], 1);
      }
    }
    g.sync();
    // With logprobs, history_raw[history_begin + j] gets the raw logit of the id at j from the
    // one thread that penalises it, NaN from the others (finish, below, reads it back).
    float* raw_of = want_logprobs ? lp.history_raw + row.history_begin : nullptr;
    for (int j = threadIdx.x; j < n_hist; j += kThreads) {
      const int32_t id = history_ids[row.history_begin + j];
      if (!slice.owns(id)) continue;
      const int32_t m = atomicExch(&marks[id], 0);
      if (m == 0) {
        if (raw_of != nullptr) raw_of[j] = __int_as_float(0x7fc00000);
        continue;
      }
      const int32_t count = m & ~kPromptBit;
      float l = logits[id];
      if (raw_of != nullptr) raw_of[j] = l;
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
  for_each_logit(logits, slice, [&](float l, int i) {
    const ArgMax c{l, i};
    if (better(c, best)) best = c;
  });
  best = row_argmax(best, sh, g);
  const bool penalised = rep || freq;
  // The sampled id's logprob: its raw logit (the penalty pass saved it where a penalty changed
  // it) less the log-sum-exp, written by the CTA whose slice holds the id.
  auto finish = [&](int32_t id) {
    if (want_logprobs && slice.owns(id)) {
      if (threadIdx.x == 0) sh.chosen_raw = logits[id];
      __syncthreads();
      if (penalised) {
        const int n_hist = row.history_end - row.history_begin;
        for (int j = threadIdx.x; j < n_hist; j += kThreads) {
          if (history_ids[row.history_begin + j] != id) continue;
          const float v = lp.history_raw[row.history_begin + j];
          if (v == v) sh.chosen_raw = v;
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        lp.logprobs[r] = sh.chosen_raw - lse;
        lp.lse[r] = lse;
      }
    }
    return id;
  };
  if (p.temperature <= 0.0f) return finish(best.id);

  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_scaled = static_cast<double>(best.value) * inv_t;
  double unused_mass;

  // Top-k: the k-th largest key; values tied with it survive.
  uint32_t min_key = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    min_key = radix_select(logits, slice, 0, false, false, 0.0, p.top_k, inv_t, max_scaled, sh, g,
                           &unused_mass);
  }
  // Top-p: the element at which the cumulative probability first reaches top_p. Its selection
  // also gives the kept mass (the weights above and at its key) unless min-p narrows the set.
  // Without either, the kept set is top-k's, whose mass is the total: it is then summed in the
  // masses' fixed point (otherwise only the top-p target and the min-p bound read it).
  uint32_t keep_key = min_key;
  const bool top_p = p.top_p < 1.0f;
  const bool kept_is_total = !top_p && p.min_p <= 0.0f;
  double total = 0;
  for_each_logit(logits, slice, [&](float l, int) {
    if (order_key(l) < min_key) return;
    const double w = weight_of(l, inv_t, max_scaled);
    total += kept_is_total ? quantized(w) : w;
  });
  total = row_sum(total, sh, g);
  double kept = total;
  bool kept_known = kept_is_total;
  if (top_p) {
    double above = 0, at = 0;
    FirstPass save;
    save.save = true;
    keep_key =
        radix_select(logits, slice, min_key, true, false, static_cast<double>(p.top_p) * total, 0,
                     inv_t, max_scaled, sh, g, &above, &at, save);
    kept = above + at;
    kept_known = p.min_p <= 0.0f;
  }
  // Min-p: probabilities >= min_p * the largest one (whose weight is exactly 1).
  if (p.min_p > 0.0f) {
    uint32_t k = UINT_MAX;
    for_each_logit(logits, slice, [&](float l, int) {
      const uint32_t key = order_key(l);
      if (key >= keep_key &&
          weight_of(l, inv_t, max_scaled) / total >= static_cast<double>(p.min_p) * (1.0 / total)) {
        k = min(k, key);
      }
    });
    k = row_min(k, sh, g);
    keep_key = max(keep_key, k);
  }

  if (!kept_known) {
    kept = 0;
    for_each_logit(logits, slice, [&](float l, int) {
      if (order_key(l) >= keep_key) kept += quantized(weight_of(l, inv_t, max_scaled));
    });
    kept = row_sum(kept, sh, g);
  }
  const double u = sampling_uniform(p.seed, row.n_generated) * kept;
  // The draw's first pass: the top-p selection's (keys >= min_key, a superset of keys >=
  // keep_key that differs only in keep_key's own top-byte bin and below).
  FirstPass reuse;
  reuse.reuse = top_p;
  reuse.floor_bin = static_cast<int>(keep_key >> 24);
  double mass_above = 0;
  const uint32_t key = radix_select(logits, slice, keep_key, true, true, u, 0, inv_t, max_scaled,
                                    sh, g, &mass_above, nullptr, reuse);

  // Ties at the drawn key are walked by ascending id: take the r-th of them (r = 1 unless the
  // drawn key is shared).
  int32_t n_ties = 0;
  ArgMax first{-INFINITY, INT_MAX};
  for_each_logit(logits, slice, [&](float l, int i) {
    if (order_key(l) != key) return;
    ++n_ties;
    if (i < first.id) first = ArgMax{0.0f, i};
  });
  n_ties = row_count(n_ties, sh, g);
  int32_t id = row_argmax(first, sh, g).id;
  if (n_ties > 1) {
    const double w = quantized(weight_of(key_value(key), inv_t, max_scaled));
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
      for_each_logit(logits, slice, [&](float l, int i) {
        if (i > prev_id && i < c.id && order_key(l) == key) c = ArgMax{0.0f, i};
      });
      id = row_argmax(c, sh, g).id;
    }
  }
  return finish(id);
}

// Grid: n_ctas CTAs per row, consecutive in x (with kCluster, one cluster per row). Two CTAs per
// multiprocessor (64 registers, a few bytes spilled), so that 256 rows of one CTA each run in one
// wave rather than two; the spill costs less than the second wave.
template <bool kCluster>
__global__ void __launch_bounds__(kThreads, 2)
    sampling_kernel(int32_t* __restrict__ sampled_ids, int32_t* __restrict__ top_ids,
                    float* __restrict__ top_logits, float* __restrict__ logits_all,
                    const SamplingRow* __restrict__ rows, const int32_t* __restrict__ history_ids,
                    int vocab, int n_top, int32_t* __restrict__ token_marks, SamplingLogprobs lp,
                    int n_ctas) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ Shared sh;
  const int r = static_cast<int>(blockIdx.x) / n_ctas;
  RowGroup<kCluster> g(static_cast<int>(blockIdx.x) % n_ctas, n_ctas);
  const int32_t id = sample_row(r, top_ids, top_logits, logits_all, rows, history_ids, vocab, n_top,
                                token_marks, lp, sh, g);
  if (g.rank == 0 && threadIdx.x == 0) sampled_ids[r] = id;
  if constexpr (kCluster) g.sync();  // no CTA leaves while another may still read its slots
}

// A logit and its id as one 64-bit key whose maximum is the greedy choice: the larger value, then
// the lower id (a NaN never wins).
__device__ __forceinline__ unsigned long long greedy_key(float l, int id) {
  const uint32_t key = l == l ? order_key(l) : 0u;
  return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// Greedy rows without penalties or top-N logits: n_ctas CTAs per row each take the argmax of a
// slice and fold it into the row's packed best with a global atomicMax; the CTA that arrives last
// (a ticket per row) writes the token and leaves the best and the ticket zero for the next launch.
__global__ void __launch_bounds__(kThreads)
    greedy_kernel(int32_t* __restrict__ sampled_ids, const float* __restrict__ logits_all,
                  int vocab, int32_t* __restrict__ workspace, int n_ctas) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ unsigned long long warp_best[kWarps];
  const int r = static_cast<int>(blockIdx.x) / n_ctas;
  const Slice slice = slice_of(vocab, static_cast<int>(blockIdx.x) % n_ctas, n_ctas);
  unsigned long long best = 0;
  for_each_logit(logits_all + static_cast<int64_t>(r) * vocab, slice,
                 [&](float l, int i) { best = max(best, greedy_key(l, i)); });
  best = warp_max(best);
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kWarps; ++w) best = max(best, warp_best[w]);
  int32_t* row = workspace + static_cast<int64_t>(r) * workspace_row_words(vocab);
  auto* row_best = reinterpret_cast<unsigned long long*>(row + workspace_row_words(vocab) - 4);
  auto* ticket = reinterpret_cast<unsigned int*>(row + workspace_row_words(vocab) - 2);
  if (n_ctas > 1) {
    atomicMax(row_best, best);
    __threadfence();  // the best is in before the ticket says so
    if (atomicAdd(ticket, 1u) != static_cast<unsigned>(n_ctas - 1)) return;
    __threadfence();  // and so is every other CTA's
    best = atomicExch(row_best, 0ull);
    *ticket = 0;
  }
  sampled_ids[r] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
}

// CTAs per row: a power of two up to `limit` (capped by the caller's max_ctas_per_row when
// positive), while the grid stays within `budget` CTAs.
int ctas_per_row(int32_t n_rows, int32_t limit, int32_t max_ctas_per_row, int64_t budget) {
  if (max_ctas_per_row > 0) limit = std::min(limit, max_ctas_per_row);
  int32_t n = 1;
  while (2 * n <= limit && static_cast<int64_t>(2 * n) * n_rows <= budget) n *= 2;
  return n;
}

#if !LITELLAMA_PORTABLE_KERNELS
// Whether the cluster kernel runs as compiled for compute capability 9.0+ (a build without sm_90
// code would run it from compute_80 PTX, where its barrier is a trap).
bool cluster_kernel_available() {
  static const bool available = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, sampling_kernel<true>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.ptxVersion >= 90;
  }();
  return available;
}
#endif

}  // namespace

bool sampling_supports(int32_t vocab_size, int32_t n_top) {
  return vocab_size > 0 && vocab_size <= kSamplingMaxVocab && n_top >= 0 &&
         n_top <= kSamplingMaxTopLogits && n_top <= vocab_size;
}

size_t sampling_workspace_size_bytes(int32_t n_rows, int32_t vocab_size) {
  return static_cast<size_t>(n_rows) * static_cast<size_t>(workspace_row_words(vocab_size)) *
         sizeof(int32_t);
}

Status launch_sampling(int32_t* sampled_ids, int32_t* top_ids, float* top_logits, float* logits,
                       const SamplingRow* rows, const int32_t* history_ids, int32_t n_rows,
                       int32_t vocab_size, int32_t n_top, int32_t* token_marks, KernelStream stream,
                       bool greedy_only, int32_t max_ctas_per_row, const SamplingLogprobs& lp) {
  if (!sampling_supports(vocab_size, n_top)) {
    return make_error(StatusCode::kUnsupported,
                      "sampling: n_top_logits {} exceeds {} (or the vocabulary of {}), or the "
                      "vocabulary exceeds {}",
                      n_top, kSamplingMaxTopLogits, vocab_size, kSamplingMaxVocab);
  }
  if (n_rows == 0) return Status::ok();
  const int64_t n_sms = current_device_sm_count();
  if (greedy_only && n_top == 0 && lp.logprobs == nullptr) {
    // A light kernel (no shared histograms): up to about two CTAs per multiprocessor.
    const int n_ctas = ctas_per_row(n_rows, kMaxGreedyCtasPerRow, max_ctas_per_row, 2 * n_sms);
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(greedy_kernel, dim3(static_cast<unsigned>(n_rows * n_ctas)), dim3(kThreads),
                      0, stream, sampled_ids, logits, vocab_size, token_marks, n_ctas));
    return Status::ok();
  }
  // The general kernel: at most one CTA per multiprocessor in all (two fit, but the split of a row
  // over CTAs is planned for one).
  const int n_ctas = ctas_per_row(n_rows, kMaxCtasPerRow, max_ctas_per_row, n_sms);
#if !LITELLAMA_PORTABLE_KERNELS  // clusters have no HIP form: portable builds take one CTA per row
  if (n_ctas > 1 && current_device_supports_clusters() && cluster_kernel_available()) {
    const cudaError_t clustered = launch_kernel_clustered(
        sampling_kernel<true>, dim3(static_cast<unsigned>(n_rows * n_ctas)), dim3(kThreads), 0,
        stream, static_cast<unsigned>(n_ctas), sampled_ids, top_ids, top_logits, logits, rows,
        history_ids, vocab_size, n_top, token_marks, lp, n_ctas);
    if (clustered == cudaSuccess) return Status::ok();
    // A cluster launch the device refuses (too few free multiprocessors in one GPC, e.g. under an
    // MPS limit): one CTA per row.
    (void)cudaGetLastError();
  }
#else
  (void)n_ctas;
#endif
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel(sampling_kernel<false>, dim3(static_cast<unsigned>(n_rows)), dim3(kThreads), 0,
                    stream, sampled_ids, top_ids, top_logits, logits, rows, history_ids, vocab_size,
                    n_top, token_marks, lp, 1));
  return Status::ok();
}

}  // namespace litellama
