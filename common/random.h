// Counter-based random numbers shared by host and device code: a value depends only on
// (seed, counter), so the CPU sampler, the GPU sampler and the GPU weight fill draw the same
// stream whatever the launch shape or batch.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MB_HOST_DEVICE __host__ __device__
#else
#define MB_HOST_DEVICE
#endif

namespace moebatch {

/// splitmix64 finalizer.
MB_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform float in [0, 1) with 24 random bits from (seed, counter).
MB_HOST_DEVICE inline float uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t h = splitmix64(seed ^ splitmix64(counter));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace moebatch
