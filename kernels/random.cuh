// Deterministic random fill on the device (benchmark weights generated from a seed, test
// inputs). Element i depends only on (seed, i): the same tensor on any launch shape.
#pragma once

#include "common/random.h"
#include "kernels/types.cuh"

namespace moebatch::kernels {

using moebatch::splitmix64;
using moebatch::uniform01;

/// x[i] = bf16(uniform(-scale, scale)) from (seed, i).
void fill_uniform(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace moebatch::kernels
