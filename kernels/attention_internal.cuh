// Pieces the attention kernels' files share (kernels/attention.cu, kernels/attention_decode.cu);
// callers use kernels/attention.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.cuh"

namespace moebatch::kernels {

/// (sequence, kv head) pairs from which a decode step runs on the warp-per-sequence kernel: four
/// warps per SM of an H200 (132 SMs). Measured (30B shape, context 192): at 1,024 pairs 41.7 µs
/// against the 64-row tensor-core kernel's 59.6; at 256 pairs the 64-row kernel wins (21.6 µs),
/// since each warp walks its whole context alone.
constexpr int kWarpDecodeMinUnits = 512;

/// Whether the warp-per-sequence tensor-core decode kernel takes `p`: one query token per
/// sequence, no split-K, at least kWarpDecodeMinUnits (sequence, kv head) pairs, head_dim 64 or
/// 128, at most 16 query heads per kv head, 16-byte aligned rows.
bool decode_on_warps(const AttentionParams& p);
/// That kernel (kernels/attention_decode.cu).
void attention_decode_warps(const AttentionParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
