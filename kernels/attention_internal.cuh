// Pieces the attention kernels' files share (kernels/attention.cu, kernels/attention_decode.cu);
// callers use kernels/attention.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.cuh"

namespace moebatch::kernels {

/// Whether the warp-per-sequence tensor-core decode kernel takes `p`: one query token per
/// sequence, head_dim 64 or 128, at most 16 query heads per kv head, 16-byte aligned rows.
bool decode_on_warps(const AttentionParams& p);
/// That kernel (with split-K, its partials merged by attention_combine).
void attention_decode_warps(const AttentionParams& p, cudaStream_t stream);
/// Merges the split-K partials in p.workspace into p.out (num_splits > 1).
void attention_combine(const AttentionParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
