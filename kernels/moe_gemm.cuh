// Grouped expert GEMM for decode-sized batches: for every (token, k) pair routed to expert e,
// out[pair, :] = in[row(pair), :] · W[e]ᵀ with W [num_experts, rows, k] row-major (docs/design.md:
// w_gate_up [E, 2I, H], w_down [E, H, I]). Shaped for few rows per expert: each block streams a
// 64-row slice of one expert's weights once and applies it to all of that expert's rows.
// Weights in any codec of kernels/weight_codec.cuh: bf16, FP8 blocks or NVFP4 stay compressed in
// memory and are decoded in registers right before their MMAs (FP8 · block scale rounded once
// to bf16; NVFP4 code · group scale exact, the row scale applied to the fp32 accumulators).
#pragma once

#include "kernels/types.cuh"
#include "kernels/weight_codec.cuh"

namespace moebatch::kernels {

/// Rows per GEMM tile; moe_align pads each expert segment to a multiple of this.
constexpr int kMoeGemmTileM = 8;

/// Operands of moe_gemm. Pair p's input row is in[p / in_row_div]: in_row_div = top_k for
/// gate+up (input is the token's hidden state), 1 for down (input is the pair's activation).
struct MoeGemmParams {
  bf16* out = nullptr;                   ///< [num_pairs, n], row = pair id
  const bf16* in = nullptr;              ///< [num_pairs / in_row_div, k]
  /// [num_experts, n, k] ([num_experts, 2n, k] with silu_gate_up) as rows = num_experts · n
  /// (· 2n) of a matrix in any codec (kernels/weight_codec.cuh); data 16-byte aligned.
  QuantMatrix weight;
  const int32_t* sorted_ids = nullptr;   ///< from moe_align (block_m = kMoeGemmTileM)
  const int32_t* expert_offsets = nullptr;  ///< [num_experts + 1] from moe_align
  /// Optional, from moe_align: the grid then covers min(num_experts, num_pairs) experts (no
  /// more can have pairs) and block y takes the y-th expert with pairs, so small batches do not
  /// schedule a block per idle expert. nullptr: one block column per expert.
  const int32_t* active_experts = nullptr;
  int num_pairs = 0;
  int in_row_div = 1;
  int num_experts = 0;
  int n = 0;                             ///< output columns: multiple of 16 (of 8 with silu_gate_up)
  int k = 0;                             ///< multiple of 32 (every codec)
  /// Fused SwiGLU: weight rows [0, n) are the gate, [n, 2n) the up projection, and
  /// out = silu(in·W_gateᵀ) · (in·W_upᵀ) from the fp32 accumulators (one rounding).
  bool silu_gate_up = false;
  /// moe_gemv launched dependent (kernels/launch.cuh): sorted_ids, expert_offsets and
  /// active_experts were written two or more launches back, so its blocks read them and start
  /// their weight loads before waiting for the kernel just before (the down GEMV while gate+up
  /// still runs). false: read only after the wait, as every other operand.
  /// (Beside silu_gate_up, in its padding: the struct's layout, which the register-bound
  /// moe_gemm kernels receive, stays as it was.)
  bool routing_settled = false;
  /// moe_gemv of one token (tokens 1, no expert parallelism): `sorted_ids` is then that token's
  /// topk_ids, and block y takes pair y's expert from it directly — one dependent load where the
  /// align's active list, offsets and segment take three before the first weight load (the
  /// gate+up GEMV waits for the router; bench/RESULTS.md, session 19). Also in the padding.
  bool direct_topk = false;
  /// moe_gemv with 4-bit weights: the CUDA-core walk (kernels/gemv_device.cuh) instead of the
  /// tensor-core one (kernels/gemv_mma_device.cuh), for A/B measurement and its op cases. Also
  /// in the padding.
  bool gemv_cuda_cores = false;
  /// W8A8 (FP8-block weights only, group a multiple of 64, k % 128 == 0; sm_89 and later): the
  /// rows of `in` as e4m3 [num_pairs / in_row_div, k] with f32 scales per 128 inputs
  /// [rows, k / 128] (kernels::quantize_fp8_rows, group 128); the products then run on FP8
  /// tensor cores, each 64-wide k window's sums scaled by its weight and activation scales into
  /// the fp32 accumulators, and `in` is not read. nullptr: bf16 activations, weights decoded.
  const uint8_t* in_fp8 = nullptr;
  const float* in_scales = nullptr;
};

/// Inputs per activation scale of MoeGemmParams::in_fp8 rows (quantize_fp8_rows' group).
constexpr int kMoeGemmA8Group = 128;

/// Runs the grouped GEMM (bf16 tensor-core MMA, fp32 accumulation, one rounding): pipelined,
/// a block per 64 weight rows of an expert over all of k. The engine's path for steps of more
/// than one token where moe_gemm_tma does not take the operands (other codecs, other GPUs).
/// Requires fp8 scales with a group that is a multiple of 16, nvfp4 scales, row scales and group
/// 16, and 16-byte aligned weight data.
void moe_gemm(const MoeGemmParams& p, cudaStream_t stream);

/// The same product as moe_gemm on Hopper for bf16 weights and activations, and for W8A8
/// (FP8-block weights in groups of 128, e4m3 rows in in_fp8) (kernels/moe_gemm_tma.cu):
/// persistent CTAs stream 128-row weight tiles through a shared-memory ring filled by TMA and
/// multiply on wgmma, so the bytes in flight are not bounded by registers and no CTA restarts
/// its pipeline per tile. The engine's path for those experts in decode steps of more than one
/// token where moe_gemm_tma_available (engine/cuda/linear.cpp). Requires moe_gemm_tma_takes,
/// moe_gemm's other operand rules, and moe_wgmma_prepare on the current device.
void moe_gemm_tma(const MoeGemmParams& p, cudaStream_t stream);

/// Whether moe_gemm_tma runs on `device` (a compute capability 9.0 GPU and a build with the
/// sm_90a object, as moe_wgmma_available).
bool moe_gemm_tma_available(int device);

/// Whether moe_gemm_tma takes these operands: bf16 weights with bf16 activations (no in_fp8),
/// or FP8-block weights in groups of 128 with in_fp8 and k % 128 == 0.
bool moe_gemm_tma_takes(const MoeGemmParams& p);

/// Tokens up to which a step's experts can take moe_gemv: an expert then has at most this many
/// pairs (one per token), all inside its first kMoeGemmTileM-row segment.
constexpr int kMoeGemvMaxTokens = kMoeGemmTileM;

/// The same product as moe_gemm for at most kMoeGemvMaxTokens tokens (decode), as a grouped
/// GEMV (kernels/moe_gemv.cu): a warp streams 1–4 weight rows of one expert over all of k in
/// 16-byte loads and applies them to the expert's pairs, so a batch-1 step's experts are read by
/// thousands of warps with one load chain each instead of 64-row tiles walking k in sequence.
/// Needs active_experts; `tokens` (the call's token count) bounds the pairs per expert.
void moe_gemv(const MoeGemmParams& p, int tokens, cudaStream_t stream);

/// Pairs moe_gemv_combine takes at most (a warp each in one block).
constexpr int kMoeGemvCombineMaxPairs = 16;

/// Whether moe_gemv_combine takes p: one token's down stage (direct_topk, routing_settled, no
/// SwiGLU, no W8A8, in_row_div 1) of 1..kMoeGemvCombineMaxPairs pairs, `in` 16-byte aligned.
bool moe_gemv_combine_takes(const MoeGemmParams& p);

/// One token's down GEMV with the MoE combine and the residual add in the same launch:
/// residual[j] = bf16(residual[j] + bf16(Σ_i weights[i] · y_i[j])) in pair order, y_i = bf16(row j
/// of pair i's expert · in[i]). A block takes the same output rows of every pair, a warp each on
/// moe_gemv's CUDA-core walk, so the sum over pairs stays in the block: bitwise what moe_gemv's
/// down on that walk (for the 4-bit codecs gemv_cuda_cores; their default tensor-core walk sums in
/// another order), then moe_combine_add_rmsnorm's combine and add give. The norm is left to the
/// next launch; p.out is not written. weights: [num_pairs] or nullptr (1).
/// The experts are read before the kernel's wait (routing_settled: the kernel before must be
/// launched dependent and wait before it lets this one launch). Requires moe_gemv_combine_takes.
void moe_gemv_combine(const MoeGemmParams& p, bf16* residual, const float* weights, cudaStream_t stream);

/// The operand checks moe_gemm and moe_gemv share (MB_CHECK messages name `op`).
void check_moe_gemm_params(const MoeGemmParams& p, const char* op);

}  // namespace moebatch::kernels
