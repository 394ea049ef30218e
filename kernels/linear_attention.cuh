// Qwen3-Next's Gated DeltaNet mixer (linear attention with per-sequence recurrent state), the
// kernels between its in_proj and out_proj GEMMs; the CPU reference is
// engine/cpu/gated_delta_net.cpp, the math docs/engine.md "Qwen3-Next":
//   causal_conv_*       depthwise causal conv (kernel K, no bias) + SiLU over the q | k | v
//                       channels, continuing each sequence's conv state
//   gated_delta_rule_*  q, k L2-normalised per head (q · 1/sqrt(dk)), β = sigmoid(b),
//                       g = −exp(A_log)·softplus(a + dt_bias); per token S ← e^g S,
//                       δ = β (v − Sᵀk), S ← S + k ⊗ δ, o = Sᵀq; value head h reads key head h / r
//   gated_rmsnorm       y = rmsnorm(o) · w · silu(z) per value head (plain w, not 1 + w)
//
// Layouts (one rank's heads: nk key heads, nv = r·nk value heads):
//   proj       [tokens, proj_stride] the in_proj output in the hub's grouping (engine/weights.h,
//              lin_in): per key head g, q [dk] | k [dk] | v [r·dv] | z [r·dv]; after all
//              nk groups, per key head g, b [r] | a [r]. Value head h = g·r + j.
//   mixed      [tokens, C] conv + SiLU output, C = 2·nk·dk + nv·dv channels in the order
//              q (nk·dk) | k (nk·dk) | v (nv·dv), head-major (the conv weight's channel order)
//   conv_state [slots, C, K−1] fp32, the last K−1 conv inputs of each channel, oldest first
//   ssm_state  [slots, nv, dk, dv] fp32, S of each value head, row i (key dim) by column j
// Sequences as in the attention kernels: sequence s owns tokens [q_start[s], q_start[s+1]), in
// position order, and the state slot state_slots[s] (no two sequences share one). Reset rule
// (docs/engine.md): a sequence whose first token is at position 0 starts from a zero state
// whatever its slot holds; any other continues its slot. A negative slot (padding rows) starts
// from zero and writes nothing back. Tokens of no sequence are not written.
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// One rank's Gated DeltaNet sizes.
struct GdnDims {
  int nk = 0;           ///< key heads (q and k)
  int nv = 0;           ///< value heads, a multiple of nk
  int dk = 0;           ///< key head dim: 32, 64 or 128
  int dv = 0;           ///< value head dim: a multiple of 32, at most 256
  int conv_kernel = 0;  ///< K: 2..8
};

/// The sequences of one step and their state slots (all device arrays).
struct GdnSeqs {
  const int32_t* q_start = nullptr;      ///< [num_seqs + 1] prefix sums of tokens per sequence
  const int32_t* positions = nullptr;    ///< [num_tokens]; only each sequence's first is read
  const int32_t* state_slots = nullptr;  ///< [num_seqs]; < 0: zero state, nothing written back
  int num_seqs = 0;
};

/// Operands of causal_conv_decode / causal_conv_prefill.
struct CausalConvParams {
  bf16* out = nullptr;           ///< mixed [tokens, C]: silu(conv) of the q | k | v channels
  const bf16* proj = nullptr;    ///< [tokens, proj_stride] in_proj output (layout above)
  int64_t proj_stride = 0;       ///< elements between tokens, at least the proj row width
  const bf16* weight = nullptr;  ///< [C, K] conv1d weight (no bias)
  float* conv_state = nullptr;   ///< [slots, C, K−1] this layer's; read and advanced in place
  GdnSeqs seqs;
  GdnDims dims;
};

/// Operands of gated_delta_rule_decode / gated_delta_rule_prefill.
struct GatedDeltaRuleParams {
  bf16* out = nullptr;          ///< o [tokens, nv·dv]
  const bf16* mixed = nullptr;  ///< [tokens, C] the conv output (q, k, v)
  const bf16* proj = nullptr;   ///< [tokens, proj_stride] in_proj output: b and a are read
  int64_t proj_stride = 0;
  const bf16* a_log = nullptr;    ///< [nv] A_log
  const bf16* dt_bias = nullptr;  ///< [nv]
  float* ssm_state = nullptr;     ///< [slots, nv, dk, dv] this layer's; read and advanced in place
  GdnSeqs seqs;
  GdnDims dims;
};

/// Operands of gated_rmsnorm.
struct GatedRmsNormParams {
  bf16* out = nullptr;         ///< [tokens, nv·dv]; may alias o
  const bf16* o = nullptr;     ///< [tokens, nv·dv] the delta rule's output
  const bf16* proj = nullptr;  ///< [tokens, proj_stride] in_proj output: z is read
  int64_t proj_stride = 0;
  const bf16* weight = nullptr;  ///< [dv] the norm weight, applied as w (not 1 + w)
  int num_tokens = 0;
  GdnDims dims;
  float eps = 1e-6f;  ///< rms_norm_eps
};

/// Conv for few tokens per sequence (decode): one thread per (sequence, channel) walks the
/// sequence's tokens with the K−1 window in registers. Correct for any run length.
void causal_conv_decode(const CausalConvParams& p, cudaStream_t stream);

/// Conv for runs of tokens (prefill chunks): a block per (sequence, 32 channels), its 8 thread
/// rows take 8 consecutive tokens each; the thread of each channel that reads the old state
/// also writes the new one, so no two threads touch a slot's channel. Same contract.
void causal_conv_prefill(const CausalConvParams& p, cudaStream_t stream);

/// Delta rule, one token per sequence (decode; longer runs are correct but walk one token per
/// block step): a block per (sequence, value head, 32 columns of S); S's columns are independent,
/// each thread holds dk/4 of one column's rows in registers, loaded once and written back once.
void gated_delta_rule_decode(const GatedDeltaRuleParams& p, cudaStream_t stream);

/// The form gated_delta_rule_prefill runs a sequence in.
enum class DeltaRuleForm {
  by_length,  ///< chunked for runs of ≥ 48 tokens where it applies, else recurrent (the engine's)
  recurrent,  ///< every sequence recurrent (tests and benchmarks)
  chunked,    ///< every sequence chunked; needs dk 64 or 128, dv % 64 == 0 (tests and benchmarks)
};

/// Delta rule for runs of tokens (prefill chunks). Recurrent form: the decode grid, with q, k
/// (normalised), v, β and decay of 16 tokens staged in shared memory per step. Chunked form
/// (gated_delta_chunked.cu): chunks of 64 tokens in the WY / UT-transform representation on
/// tensor cores, a block per (64 columns of S, value head, sequence); applies to dk 64 and 128,
/// dv % 64 == 0 and 16-byte aligned mixed, out and ssm_state. Same contract either way.
void gated_delta_rule_prefill(const GatedDeltaRuleParams& p, cudaStream_t stream,
                              DeltaRuleForm form = DeltaRuleForm::by_length);

/// y = o · rsqrt(mean(o²) + eps) · w · silu(z) per (token, value head), fp32 math, one rounding.
void gated_rmsnorm(const GatedRmsNormParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
