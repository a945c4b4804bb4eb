// SplitMix64: the 64-bit mixer behind every deterministic random value of the project (random
// checkpoint weights, the sampler's counter-based draws). kernels/sampling.cu carries a device
// copy that must stay identical, so the CPU and GPU samplers draw the same numbers.
#pragma once

#include <cstdint>

namespace litellama {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace litellama
