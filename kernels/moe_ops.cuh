// Element-wise gates and sums around the GEMMs: SiLU·mul, the attention output gate
// (Qwen3-Next), the weighted combine over top-k, and the shared expert with its sigmoid gate.
#pragma once

#include "kernels/rmsnorm.cuh"
#include "kernels/types.cuh"

namespace moebatch::kernels {

/// out[r, i] = silu(in[r, i]) * in[r, inter + i] for in [rows, 2*inter] (gate half, then up
/// half, as w_gate_up stacks them). inter % 8 == 0. fp32 math, one rounding.
void silu_mul(bf16* out, const bf16* in, int rows, int inter, cudaStream_t stream);

/// x[r, i] = x[r, i] · sigmoid(gate[r · gate_stride + i]) for x [rows, cols] (the attention
/// output gate of Qwen3-Next). cols % 8 == 0, gate rows 16-byte aligned. fp32 math, one rounding.
void sigmoid_gate_mul(bf16* x, const bf16* gate, int64_t gate_stride, int rows, int cols,
                      cudaStream_t stream);

/// out[t, :] = sum_j weights[t, j] * expert_out[t * top_k + j, :], summed in fp32 in j order
/// (deterministic). weights may be nullptr (already applied). hidden % 8 == 0.
void moe_combine(bf16* out, const bf16* expert_out, const float* weights, int tokens, int top_k,
                 int hidden, cudaStream_t stream);

/// Operands of moe_combine, with the expert-parallel mask.
struct MoeCombineParams {
  bf16* out = nullptr;               ///< [tokens, hidden]
  const bf16* expert_out = nullptr;  ///< [tokens * top_k, hidden]
  const float* weights = nullptr;    ///< [tokens, top_k], or nullptr (already applied)
  int tokens = 0;
  int top_k = 0;
  int hidden = 0;                    ///< multiple of 8
  /// Expert parallel: [tokens, top_k] global expert ids. Only pairs whose expert lies in
  /// [expert0, expert0 + num_local) (this rank's) are summed; the others add nothing and their
  /// expert_out rows, which no GEMM wrote, are never read. nullptr: every pair counts.
  const int32_t* topk_ids = nullptr;
  int expert0 = 0;
  int num_local = 0;
  /// Expert outputs in another row order (the sorted rows of moe_gather_sorted): pair p's row is
  /// expert_out[row_of_pair[p]]. nullptr: row p.
  const int32_t* row_of_pair = nullptr;
};

/// The same sum over this rank's pairs (every pair without topk_ids; then the same kernel as the
/// positional overload). A token with no local pair gets a zero row.
void moe_combine(const MoeCombineParams& p, cudaStream_t stream);

/// moe_combine fused with the residual add + RMSNorm after it, one block per token: with
/// o = bf16(Σ_j w · y) as moe_combine rounds it, norm.residual = bf16(norm.residual + o) in place
/// and norm.out = rmsnorm(residual) · (weight_offset + weight) — bitwise what moe_combine into a
/// buffer then add_rmsnorm of it give. c.out and norm.in are unused; norm.rows == c.tokens,
/// norm.cols == c.hidden. c.top_k 0: no expert rows (moe_gemv_combine added them into the
/// residual already): the residual's norm alone.
void moe_combine_add_rmsnorm(const MoeCombineParams& c, const RmsNormParams& norm,
                             cudaStream_t stream);

/// Operands of shared_expert_gate.
struct SharedExpertGateParams {
  bf16* out = nullptr;              ///< [tokens, hidden]; may alias moe_out
  const bf16* moe_out = nullptr;    ///< [tokens, hidden] routed experts' combined output
  const bf16* shared_out = nullptr; ///< [tokens, hidden] shared expert MLP output
  const bf16* x = nullptr;          ///< [tokens, hidden] the MoE block's input
  const bf16* gate_weight = nullptr;///< [hidden] shared_expert_gate (a [1, hidden] linear)
  int tokens = 0;
  int hidden = 0;                   ///< multiple of 8
};

/// out = moe_out + sigmoid(x · gate_weight) * shared_out (Qwen2-MoE), gate dot in fp32.
void shared_expert_gate(const SharedExpertGateParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
