// Deterministic random fill on the device (benchmark weights generated from a seed, test
// inputs). Element i depends only on (seed, i): the same tensor on any launch shape.
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// splitmix64 finalizer; also the sampler's per-sequence random source.
__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform float in [0, 1) with 24 random bits from (seed, counter).
__host__ __device__ inline float uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t h = splitmix64(seed ^ splitmix64(counter));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

/// x[i] = bf16(uniform(-scale, scale)) from (seed, i).
void fill_uniform(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace moebatch::kernels
