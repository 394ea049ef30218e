// Pieces the attention kernels' files share (kernels/attention.cu, kernels/attention_decode.cu);
// callers use kernels/attention.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.cuh"

namespace moebatch::kernels {

/// (sequence, kv head) pairs from which a decode step runs on the warp-per-sequence kernel: four
/// warps per SM of an H200 (132 SMs). Measured (30B shape, context 192): at 1,024 pairs 41.7 µs
/// against the 64-row tensor-core kernel's 59.6; at 256 pairs the 64-row kernel wins (21.6 µs),
/// since each warp walks its whole context alone. Below it the split kernel takes the step.
constexpr int kWarpDecodeMinUnits = 512;
static_assert(kWarpDecodeMinUnits <= kAttentionCounters,
              "a ticket counter per pair of the split kernel");

/// The split-K workspace (attention_workspace_floats): ticket counters, then the partials.
__device__ __forceinline__ unsigned* attention_counters(const AttentionParams& p) {
  return reinterpret_cast<unsigned*>(p.workspace);
}
__device__ __forceinline__ float* attention_partials(const AttentionParams& p) {
  return p.workspace + kAttentionCounters;
}

/// Whether the warp-per-sequence tensor-core decode kernel takes `p`: one query token per
/// sequence, no split-K, at least kWarpDecodeMinUnits (sequence, kv head) pairs, head_dim 64 or
/// 128, at most 16 query heads per kv head, 16-byte aligned rows.
bool decode_on_warps(const AttentionParams& p);
/// That kernel (kernels/attention_decode.cu).
void attention_decode_warps(const AttentionParams& p, cudaStream_t stream);

/// Whether the small-batch split kernel takes `p`: as decode_on_warps but fewer than
/// kWarpDecodeMinUnits pairs, any split count (from 2 a 16-byte aligned workspace).
bool decode_on_split_warps(const AttentionParams& p);
/// That kernel (kernels/attention_decode.cu): one launch, partials combined by the last split.
void attention_decode_split_warps(const AttentionParams& p, cudaStream_t stream);

/// Whether prefill may run on the wgmma kernel (kernels/attention_wgmma.cu): head_dim 128 with a
/// context longer than one 128-key tile, or head_dim 256 (64-key tiles); cache blocks that divide
/// a tile into at most 32; moe_wgmma_available for the current device; p.prefill_kernel not
/// mma_sync. The caller checks the rest (attention.cu: rows, alignment, no split-K).
bool prefill_on_wgmma(const AttentionParams& p);
/// Where that kernel rotates q itself with rope_q (attention_prefill_rotates_q, given
/// prefill_on_wgmma): the persistent form (head_dim 128), every dim rotating, the rotation table
/// given and 16-byte aligned, as the norm weights.
bool wgmma_rotates_q(const AttentionParams& p);
/// That kernel: blocks of 128 rows (two warpgroups) × 128-key tiles (64 at head_dim 256); at
/// head_dim 128 persistent (one block per SM, AttentionParams::max_blocks at most) with a
/// producer warpgroup beside the two.
void attention_prefill_wgmma(const AttentionParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
