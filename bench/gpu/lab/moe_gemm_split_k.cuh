// Kernel lab: a split-K variant of the grouped expert GEMM (kernels/moe_gemm.cuh), kept for
// comparison; not on the engine path (at batch 1 it measured slower than moe_gemm, see
// docs/kernels.md "Kernel lab").
#pragma once

#include "kernels/moe_gemm.cuh"

namespace moebatch::lab {

/// Same contract as kernels::moe_gemm for bf16 weights only (any pair count; meant for experts
/// with ≤ 8 rows): a block owns 16 weight rows and its 4 warps split k, summed in a fixed order
/// (deterministic).
void moe_gemm_split_k(const kernels::MoeGemmParams& p, cudaStream_t stream);

}  // namespace moebatch::lab
