// litellama-linear-bench: time per linear layer of decode shapes, back to back as in a decode
// step. Each variant launches the same shape over enough distinct weight copies that nothing is
// served from L2, captures the launches in one CUDA graph and reports the median replay time per
// launch and the weight bytes read per second. Variants: the small-batch GEMV with and without
// programmatic dependent launch, cuBLAS, and a plain streaming read of the same bytes (the rate a
// kernel of that size can reach at all). With --sweep, every tile configuration of the GEMV
// kernel (gemv_impl.cuh) is timed too, to choose gemv.cu's policy, with k cut into 2, 4 and 8
// segments for the shapes of few tiles. With --w4, the 4-bit GEMV (linear_w4_impl.cuh) instead,
// in each warps-per-block and ring-depth configuration, on the Llama-3.1-8B and -3.2-1B
// projections in groups of 128, beside a plain read of the same bytes. With --fp8, the FP8 path
// on the same projections: for m <= 16 the GEMV (linear_fp8_impl.cuh) in each configuration beside
// a plain read; for larger m the per-token quantizer + cuBLASLt FP8 GEMM beside cuBLAS in bf16.
//
// Usage: litellama-linear-bench [--m 1] [--reps 20] [--sweep 1] [--w4 1] [--fp8 1]   (one JSON
// object per line)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/gemv_impl.cuh"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/linear_fp8_impl.cuh"
#include "kernels/linear_w4.h"
#include "kernels/linear_w4_impl.cuh"

namespace litellama {
namespace {

#define CHECK(expr)                                                                                \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_OK(expr)                                                 \
  do {                                                                 \
    const Status s_ = (expr);                                          \
    if (!s_.is_ok()) {                                                 \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.to_string().c_str()); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

// Reads n16 16-byte words and folds them into one word that is stored only if it has an
// impossible value, so the loads cannot be removed.
__global__ void stream_read_kernel(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  pdl_launch_dependents();
  pdl_wait();
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

struct Shape {
  const char* name;
  int32_t n, k;
  bool silu;  // gate/up with SiLU: n = inter, weights [2 inter, k]
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over reps of one replay of a graph of `launches` calls of body(i), per call, in us.
float time_graph(cudaStream_t stream, int launches, int reps,
                 const std::function<void(int)>& body) {
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) body(i);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> times;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e3f / static_cast<float>(launches));
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return median(times);
}

template <int W, int V, int P>
struct Cfg {
  static constexpr int kWarps = W, kVecs = V, kPipe = P;
};
// (warps per block, 16-byte vectors per row per lane and chunk, chunks in registers)
using PlainConfigs = std::tuple<Cfg<4, 1, 4>, Cfg<4, 1, 8>, Cfg<4, 2, 4>, Cfg<8, 1, 2>,
                                Cfg<8, 1, 4>, Cfg<8, 1, 8>, Cfg<8, 2, 2>, Cfg<8, 2, 4>,
                                Cfg<16, 1, 2>, Cfg<16, 1, 4>, Cfg<16, 2, 2>, Cfg<32, 1, 2>>;
using NoSegments = std::integral_constant<int, 1>;
using SegmentConfigs = std::tuple<Cfg<4, 1, 4>, Cfg<8, 1, 4>, Cfg<8, 1, 8>, Cfg<16, 1, 2>>;
using SiluConfigs =
    std::tuple<Cfg<4, 1, 4>, Cfg<4, 1, 6>, Cfg<4, 2, 2>, Cfg<8, 1, 2>, Cfg<8, 1, 3>, Cfg<8, 1, 4>,
               Cfg<8, 1, 6>, Cfg<8, 2, 2>, Cfg<16, 1, 2>, Cfg<16, 2, 1>, Cfg<16, 3, 1>>;

template <int W, int D1, int D2, int T>
struct W4Cfg {
  static constexpr int kWarps = W, kDepth1 = D1, kDepth2 = D2, kTiles = T;
};
// (warps per block, ring depth with one / two blocks of tokens, column tiles per block)
using W4Configs =
    std::tuple<W4Cfg<4, 1, 1, 1>, W4Cfg<4, 2, 1, 1>, W4Cfg<4, 1, 1, 2>, W4Cfg<4, 2, 1, 2>,
               W4Cfg<8, 1, 1, 1>, W4Cfg<8, 2, 1, 1>, W4Cfg<8, 1, 1, 2>, W4Cfg<8, 2, 1, 2>,
               W4Cfg<16, 1, 1, 1>, W4Cfg<16, 2, 1, 1>, W4Cfg<16, 1, 1, 2>>;

struct QuantShape {
  const char* name;
  int32_t n, k;
};
const QuantShape kQuantShapes[] = {{"8b.qkv", 6144, 4096},      {"8b.o", 4096, 4096},
                                   {"8b.gate_up", 28672, 4096}, {"8b.down", 4096, 14336},
                                   {"1b.qkv", 3072, 2048},      {"1b.gate_up", 16384, 2048},
                                   {"1b.down", 2048, 8192}};

// (warps per block, ring depth with one / two blocks of tokens, column tiles per block)
using Fp8Configs = std::tuple<W4Cfg<4, 1, 1, 1>, W4Cfg<4, 2, 1, 1>, W4Cfg<8, 1, 1, 1>,
                              W4Cfg<8, 2, 1, 1>, W4Cfg<8, 1, 1, 2>, W4Cfg<8, 2, 2, 2>,
                              W4Cfg<16, 1, 1, 1>, W4Cfg<16, 2, 1, 1>, W4Cfg<16, 1, 1, 2>>;

// The FP8 path on each projection shape (codes of zeros: the kernels' time does not depend on the
// values). x and y hold m rows of the widest shape; xq / x_scales the quantizer's output.
void run_fp8(int m, int reps, cudaStream_t stream, char* pool, size_t pool_bytes, void* x, void* y,
             uint32_t* sink, cublasHandle_t blas) {
  auto gemm = Fp8Gemm::create();
  CHECK_OK(gemm.status());
  void* lt_ws = nullptr;
  constexpr size_t kLtWorkspace = size_t{32} << 20;
  CHECK(cudaMalloc(&lt_ws, kLtWorkspace));
  uint8_t* xq = nullptr;
  float* x_scales = nullptr;
  CHECK(cudaMalloc(&xq, static_cast<size_t>(m) * 16384));
  CHECK(cudaMalloc(&x_scales, static_cast<size_t>(m) * sizeof(float)));
  for (const QuantShape& s : kQuantShapes) {
    const size_t codes = static_cast<size_t>(s.n) * s.k;
    const size_t bytes = codes + static_cast<size_t>(s.n) * 4;
    const size_t stride = (bytes + 255) / 256 * 256;
    const int copies = static_cast<int>(std::min<size_t>(64, pool_bytes / stride));
    const int launches = std::max(copies, 8);
    auto weight = [&](int i) {
      char* base = pool + static_cast<size_t>(i % copies) * stride;
      return Fp8Weight{reinterpret_cast<const uint8_t*>(base),
                       reinterpret_cast<const float*>(base + codes), s.n, s.k};
    };
    KernelStream ks(stream, true);
    auto report = [&](const std::string& name, float us) {
      const double flops = 2.0 * m * s.n * s.k;
      std::printf(
          "{\"shape\": \"fp8.%s\", \"m\": %d, \"variant\": \"%s\", \"us\": %.2f, \"mb\": "
          "%.1f, \"gb_per_s\": %.0f, \"tflops\": %.1f}\n",
          s.name, m, name.c_str(), us, bytes / 1e6, bytes / (us * 1e-6) / 1e9,
          flops / (us * 1e-6) / 1e12);
      std::fflush(stdout);
    };
    if (m > kFp8GemvMaxRows) {
      // bf16 reference: the same shape's dense weights (half the copies fit the pool).
      const size_t dense = codes * 2;
      const int dense_copies = static_cast<int>(std::min<size_t>(64, pool_bytes / dense));
      report("cublas.bf16", time_graph(stream, std::max(dense_copies, 8), reps, [&](int i) {
               CHECK_OK(launch_linear(y, x, pool + static_cast<size_t>(i % dense_copies) * dense, m,
                                      s.n, s.k, DType::kBF16, DType::kBF16, blas, stream));
             }));
      report("quantize", time_graph(stream, launches, reps, [&](int) {
               CHECK_OK(launch_fp8_quantize_rows(xq, x_scales, x, m, s.k, DType::kBF16, ks));
             }));
      report("quantize+lt.fp8", time_graph(stream, launches, reps, [&](int i) {
               CHECK_OK(launch_fp8_quantize_rows(xq, x_scales, x, m, s.k, DType::kBF16, ks));
               CHECK_OK((*gemm)->run(y, xq, x_scales, weight(i), m, DType::kBF16, lt_ws,
                                     kLtWorkspace, ks));
             }));
      std::printf("{\"shape\": \"fp8.%s\", \"m\": %d, \"lt_fallback\": %s}\n", s.name, m,
                  (*gemm)->used_fallback() ? "true" : "false");
      continue;
    }
    report("read+pdl", time_graph(stream, launches, reps, [&](int i) {
             CHECK(launch_kernel(stream_read_kernel, dim3(132 * 8), dim3(256), 0, ks,
                                 reinterpret_cast<const uint4*>(weight(i).codes),
                                 static_cast<int64_t>(bytes / 16), sink));
           }));
    auto try_config = [&](auto cfg) {
      using C = decltype(cfg);
      report("w" + std::to_string(C::kWarps) + ".d" + std::to_string(C::kDepth1) + "." +
                 std::to_string(C::kDepth2) + ".t" + std::to_string(C::kTiles),
             time_graph(stream, launches, reps, [&](int i) {
               CHECK((fp8_detail::launch_gemv<__nv_bfloat16, C::kWarps, C::kDepth1, C::kDepth2,
                                              C::kTiles>(y, x, weight(i), m, ks)));
             }));
    };
    std::apply([&](auto... c) { (try_config(c), ...); }, Fp8Configs{});
  }
  CHECK(cudaFree(lt_ws));
  CHECK(cudaFree(xq));
  CHECK(cudaFree(x_scales));
}

// The 4-bit GEMV's configurations on each projection shape (weights of zeros: the kernel's time
// does not depend on the values).
void run_w4(int m, int reps, cudaStream_t stream, char* pool, size_t pool_bytes, void* x, void* y,
            uint32_t* sink) {
  constexpr int32_t kGroup = 128;
  for (const QuantShape& s : kQuantShapes) {
    const size_t codes = static_cast<size_t>(s.n) * s.k / 2;
    const size_t groups = static_cast<size_t>(s.n) * (s.k / kGroup);
    const size_t bytes = codes + groups * 3;  // codes, zero points, bf16 scales
    const size_t stride = (bytes + 255) / 256 * 256;
    const int copies = static_cast<int>(std::min<size_t>(64, pool_bytes / stride));
    const int launches = std::max(copies, 8);
    auto weight = [&](int i) {
      char* base = pool + static_cast<size_t>(i % copies) * stride;
      return W4Weight{reinterpret_cast<const uint32_t*>(base),
                      reinterpret_cast<const uint8_t*>(base + codes),
                      base + codes + groups,
                      s.n,
                      s.k,
                      kGroup};
    };
    KernelStream ks(stream, true);
    auto report = [&](const std::string& name, float us) {
      std::printf(
          "{\"shape\": \"w4.%s\", \"m\": %d, \"variant\": \"%s\", \"us\": %.2f, \"mb\": "
          "%.1f, \"gb_per_s\": %.0f}\n",
          s.name, m, name.c_str(), us, bytes / 1e6, bytes / (us * 1e-6) / 1e9);
      std::fflush(stdout);
    };
    report("read+pdl", time_graph(stream, launches, reps, [&](int i) {
             CHECK(launch_kernel(stream_read_kernel, dim3(132 * 8), dim3(256), 0, ks,
                                 reinterpret_cast<const uint4*>(weight(i).codes),
                                 static_cast<int64_t>(bytes / 16), sink));
           }));
    auto try_config = [&](auto cfg) {
      using C = decltype(cfg);
      report(
          "w" + std::to_string(C::kWarps) + ".d" + std::to_string(C::kDepth1) + "." +
              std::to_string(C::kDepth2) + ".t" + std::to_string(C::kTiles),
          time_graph(stream, launches, reps, [&](int i) {
            CHECK((
                w4_detail::launch_gemv<__nv_bfloat16, C::kWarps, C::kDepth1, C::kDepth2, C::kTiles>(
                    y, x, weight(i), m, ks)));
          }));
    };
    std::apply([&](auto... c) { (try_config(c), ...); }, W4Configs{});
  }
}

int run(int argc, char** argv) {
  int m = 1, reps = 20;
  bool sweep = false, w4 = false, fp8 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--m") == 0) m = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sweep") == 0) sweep = std::atoi(argv[i + 1]) != 0;
    if (std::strcmp(argv[i], "--w4") == 0) w4 = std::atoi(argv[i + 1]) != 0;
    if (std::strcmp(argv[i], "--fp8") == 0) fp8 = std::atoi(argv[i + 1]) != 0;
  }
  const Shape shapes[] = {
      {"1b.qkv", 3072, 2048, false},         {"1b.o", 2048, 2048, false},
      {"1b.gate_up+silu", 8192, 2048, true}, {"1b.down", 2048, 8192, false},
      {"1b.lm_head", 128256, 2048, false},   {"8b.qkv", 6144, 4096, false},
      {"8b.o", 4096, 4096, false},           {"8b.gate_up+silu", 14336, 4096, true},
      {"8b.down", 4096, 14336, false},       {"qwen.qkv", 2048, 1536, false},
      {"qwen.o", 1536, 1536, false},         {"qwen.gate_up+silu", 8960, 1536, true},
      {"qwen.down", 1536, 8960, false},
  };
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  void* x = nullptr;
  void* y = nullptr;
  uint32_t* sink = nullptr;
  const size_t max_rows = std::max<size_t>({kGemvMaxRows, kW4GemvMaxRows, static_cast<size_t>(m)});
  CHECK(cudaMalloc(&x, max_rows * 16384 * 2));
  CHECK(cudaMemset(x, 0, max_rows * 16384 * 2));
  CHECK(cudaMalloc(&y, std::max<size_t>(size_t{kGemvMaxRows} * 128256 * 4, max_rows * 28672 * 2)));
  CHECK(cudaMalloc(&sink, 4));
  constexpr size_t kPoolBytes = size_t{3} << 30;  // far past L2
  char* pool = nullptr;
  CHECK(cudaMalloc(&pool, kPoolBytes));
  CHECK(cudaMemset(pool, 0, kPoolBytes));
  if (fp8) {
    run_fp8(m, reps, stream, pool, kPoolBytes, x, y, sink, blas);
    CHECK(cudaFree(pool));
    return 0;
  }
  if (w4) {
    run_w4(m, reps, stream, pool, kPoolBytes, x, y, sink);
    CHECK(cudaFree(pool));
    return 0;
  }
  for (const Shape& s : shapes) {
    const int64_t rows = s.silu ? 2 * int64_t{s.n} : s.n;
    const size_t bytes = static_cast<size_t>(rows) * s.k * 2;
    const int copies = static_cast<int>(std::min<size_t>(64, kPoolBytes / bytes));
    const int launches = std::max(copies, 8);
    auto weights = [&](int i) { return pool + static_cast<size_t>(i % copies) * bytes; };
    const DType out = std::strcmp(s.name, "1b.lm_head") == 0 ? DType::kF32 : DType::kBF16;
    // The launches' stream; each variant sets whether they carry PDL.
    KernelStream ks(stream, true);
    auto gemv = [&](int i) {
      if (s.silu) {
        CHECK_OK(launch_gemv_silu_mul(y, x, weights(i), m, s.n, s.k, DType::kBF16, ks));
      } else {
        CHECK_OK(launch_gemv(y, x, weights(i), m, s.n, s.k, DType::kBF16, out, ks));
      }
    };
    auto blas_call = [&](int i) {
      CHECK_OK(launch_linear(y, x, weights(i), m, static_cast<int32_t>(rows), s.k, DType::kBF16,
                             out, blas, stream));
    };
    auto read = [&](int i) {
      const int64_t n16 = static_cast<int64_t>(bytes / 16);
      CHECK(launch_kernel(stream_read_kernel, dim3(132 * 8), dim3(256), 0, ks,
                          reinterpret_cast<const uint4*>(weights(i)), n16, sink));
    };
    struct Variant {
      const char* name;
      bool pdl;
      std::function<void(int)> body;
    };
    const Variant variants[] = {{"gemv+pdl", true, gemv},
                                {"gemv", false, gemv},
                                {"cublas", false, blas_call},
                                {"read+pdl", true, read},
                                {"read", false, read}};
    auto report = [&](const std::string& name, float us) {
      std::printf(
          "{\"shape\": \"%s\", \"m\": %d, \"variant\": \"%s\", \"us\": %.2f, \"mb\": %.1f, "
          "\"gb_per_s\": %.0f}\n",
          s.name, m, name.c_str(), us, bytes / 1e6, bytes / (us * 1e-6) / 1e9);
      std::fflush(stdout);
    };
    for (const Variant& v : variants) {
      ks.programmatic = v.pdl;
      report(v.name, time_graph(stream, launches, reps, v.body));
    }
    if (!sweep) continue;
    ks.programmatic = true;
    auto try_config = [&](auto cfg, auto silu_c, auto segs_c) {
      using C = decltype(cfg);
      constexpr bool kSilu = decltype(silu_c)::value;
      constexpr int kSegs = decltype(segs_c)::value;
      // k must be whole chunks of each segment; a segment per token takes a column of the mma
      if (s.k % (kSegs * 32 * C::kVecs) != 0 || m * kSegs > kGemvMaxRows) return;
      using gemv_detail::Epilogue;
      auto run_config = [&](auto loop_c) {
        constexpr bool kLoop = decltype(loop_c)::value;
        auto body = [&](int i) {
          gemv_detail::Params p{};
          p.x = x;
          p.w = weights(i);
          p.y = y;
          p.m = m;
          p.n = kSilu ? 2 * s.n : s.n;
          p.k = s.k;
          p.ldy = s.n;
          cudaError_t e;
          if constexpr (kSilu) {
            e = gemv_detail::launch<__nv_bfloat16, __nv_bfloat16, 2, Epilogue::kSiluMul, C::kWarps,
                                    C::kVecs, C::kPipe, false, kLoop>(p, ks);
          } else if (out == DType::kF32) {
            e = gemv_detail::launch<__nv_bfloat16, float, 1, Epilogue::kStore, C::kWarps, C::kVecs,
                                    C::kPipe, false, kLoop, kSegs>(p, ks);
          } else {
            e = gemv_detail::launch<__nv_bfloat16, __nv_bfloat16, 1, Epilogue::kStore, C::kWarps,
                                    C::kVecs, C::kPipe, false, kLoop, kSegs>(p, ks);
          }
          CHECK(e);
        };
        report("w" + std::to_string(C::kWarps) + ".v" + std::to_string(C::kVecs) + ".p" +
                   std::to_string(C::kPipe) +
                   (kSegs > 1 ? ".s" + std::to_string(kSegs) : std::string()) +
                   (kLoop ? ".loop" : ".unit"),
               time_graph(stream, launches, reps, body));
      };
      run_config(std::true_type{});
      run_config(std::false_type{});
    };
    if (s.silu) {
      std::apply([&](auto... c) { (try_config(c, std::true_type{}, NoSegments{}), ...); },
                 SiluConfigs{});
    } else {
      std::apply([&](auto... c) { (try_config(c, std::false_type{}, NoSegments{}), ...); },
                 PlainConfigs{});
      // k cut into segments (units of 16 / segs rows) for the shapes of few tiles
      if (s.n / 16 <= 2 * 132) {
        std::apply(
            [&](auto... c) {
              (try_config(c, std::false_type{}, std::integral_constant<int, 2>{}), ...);
              (try_config(c, std::false_type{}, std::integral_constant<int, 4>{}), ...);
              (try_config(c, std::false_type{}, std::integral_constant<int, 8>{}), ...);
            },
            SegmentConfigs{});
      }
    }
  }
  CHECK(cudaFree(pool));
  return 0;
}

}  // namespace
}  // namespace litellama

int main(int argc, char** argv) {
  return litellama::run(argc, argv);
}
