// The expert MLP of many-token steps (prefill) as dense GEMMs per expert: the routed (token, k)
// pairs' inputs gathered into moe_align's sorted order, so each expert's rows are one contiguous
// block a library GEMM takes (cuBLAS on tensor cores), and the map back from pairs to those
// rows for moe_combine. This is the path of GPUs without the wgmma kernel (kernels/moe_wgmma.cuh
// gathers in its own loads); decode-sized steps use moe_gemm (kernels/moe_gemm.cuh), which needs
// no host round trip and can be captured in a graph.
#pragma once

#include <cstdint>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Operands of moe_gather_sorted.
struct MoeGatherParams {
  bf16* out = nullptr;                      ///< [rows_cap, hidden] gathered rows, sorted order
  int32_t* row_of_pair = nullptr;           ///< [num_pairs] sorted row of each pair (written for
                                            ///< the pairs of local experts only)
  const bf16* in = nullptr;                 ///< [num_pairs / in_row_div, hidden]
  const int32_t* sorted_ids = nullptr;      ///< from moe_align: pair id, or ≥ num_pairs (padding)
  const int32_t* expert_offsets = nullptr;  ///< [num_experts + 1] from moe_align (device)
  int num_experts = 0;                      ///< local experts aligned
  int num_pairs = 0;
  int in_row_div = 1;                       ///< top_k: pair p's input row is p / top_k
  int hidden = 0;                           ///< multiple of 8
  int rows_cap = 0;                         ///< rows of `out` (moe_align_capacity)
};

/// out[i] = in[sorted_ids[i] / in_row_div] for the sorted rows i < expert_offsets[num_experts]
/// (padding rows: zeros), and row_of_pair[sorted_ids[i]] = i for the real pairs.
void moe_gather_sorted(const MoeGatherParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
