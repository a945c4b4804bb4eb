// The prefix cache and preemption through the real services with a CUDA worker: in float32 every
// request served with cached KV (and every request preempted by recompute in a pool a tenth of
// what the load needs, batched with others) gives the greedy ids and top logits of the same
// request alone on a cold server bit for bit (the batch-invariant float32 kernels); in bfloat16
// within the 16-bit tolerance (tests/integration/prefix_cache_checks.h).
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/prefix_cache_checks.h"

namespace litellama {
namespace {

using testing::Match;

TEST(CudaPrefixCache, CachedPrefixesGiveIdenticalIdsAndTopLogitsInFloat32) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_cached_prefixes({"--device", "cuda", "--dtype", "float32"}, Match::kExact);
}

TEST(CudaPrefixCache, CachedPrefixesMatchWithinToleranceInBfloat16) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_cached_prefixes({"--device", "cuda", "--dtype", "bfloat16"},
                                 Match::kHalfPrecision);
}

TEST(CudaPrefixCache, TinyPoolPreemptsAndEveryRequestMatchesRunningAloneInFloat32) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_tiny_pool({"--device", "cuda", "--dtype", "float32"}, Match::kExact);
}

TEST(CudaPrefixCache, TinyPoolPreemptsAndEveryRequestCompletesInBfloat16) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  testing::check_tiny_pool({"--device", "cuda", "--dtype", "bfloat16"}, Match::kHalfPrecision);
}

}  // namespace
}  // namespace litellama
