// The prefix cache and preemption through the real services with a CUDA worker: in float32 every
// request served with cached KV (and every request preempted by recompute in a pool a tenth of
// what the load needs) gives the greedy ids of the same request alone on a cold server, and top
// logits within 1e-5 relative (not bit for bit: steps of other shapes run other kernels); in
// bfloat16 within the 16-bit tolerance (tests/integration/prefix_cache_checks.h).
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/prefix_cache_checks.h"

namespace litellama {
namespace {

using testing::Match;

TEST(CudaPrefixCache, CachedPrefixesGiveIdenticalIdsAndTopLogitsWithin1e5InFloat32) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_cached_prefixes({"--device", "cuda", "--dtype", "float32"}, Match::kFloat32Device);
}

TEST(CudaPrefixCache, CachedPrefixesMatchWithinToleranceInBfloat16) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_cached_prefixes({"--device", "cuda", "--dtype", "bfloat16"},
                                 Match::kHalfPrecision);
}

TEST(CudaPrefixCache, TinyPoolPreemptsAndEveryRequestMatchesRunningAloneInFloat32) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_tiny_pool({"--device", "cuda", "--dtype", "float32"}, Match::kFloat32Device);
}

TEST(CudaPrefixCache, TinyPoolPreemptsAndEveryRequestCompletesInBfloat16) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_tiny_pool({"--device", "cuda", "--dtype", "bfloat16"}, Match::kHalfPrecision);
}

}  // namespace
}  // namespace litellama
