// Internal to the gated delta rule (linear_attention.cu, gated_delta_chunked.cu): the device
// helpers both forms share, the rule that picks a form per sequence, and the chunked form's
// launcher. Contract and layouts: kernels/linear_attention.cuh.
#pragma once

#include <cmath>

#include "kernels/linear_attention.cuh"

namespace moebatch::kernels::gdn {

// transformers' l2norm epsilon for q and k (fixed, not rms_norm_eps), as the CPU reference.
constexpr float kL2NormEps = 1e-6f;

/// The form picked per sequence (DeltaRuleForm::by_length): runs of at least this many tokens
/// take the chunked kernel. Why 48, measured on an H200 at the Qwen3-Next-80B shape
/// (bench/RESULTS.md, 2026-12-01 session 7): a chunk costs the chunked kernel about the same
/// whatever its fill (it is padded to 64 tokens), 64 sequences of 16 / 32 tokens 591 / 646 µs,
/// while the recurrent kernel grows ~13 µs per token there (267 / 480 µs); the lines cross at
/// ~48 tokens. One 2048-token prompt: chunked 723 µs, recurrent 1,359.
constexpr int kChunkedMinRun = 48;

/// q's scale 1/sqrt(dk) as the CPU computes it: in double, rounded once.
inline float q_scale(int dk) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
}

__device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }
// torch's softplus (threshold 20), as cpu::softplus.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__host__ __device__ __forceinline__ int conv_dim(const GdnDims& d) {
  return 2 * d.nk * d.dk + d.nv * d.dv;
}

// Column of value head h's b in a proj row (its a is r columns further): after the nk groups of
// q | k | v | z, per key head g: b [r] | a [r].
__device__ __forceinline__ int64_t gate_col(const GdnDims& d, int h) {
  const int r = d.nv / d.nk;
  return static_cast<int64_t>(d.nk) * (2 * d.dk + 2 * r * d.dv) + (h / r) * 2 * r + h % r;
}

// A sequence starts from a zero state when it has no slot (padding) or starts at position 0.
__device__ __forceinline__ bool fresh_state(const GdnSeqs& s, int first_token, int slot) {
  return slot < 0 || s.positions[first_token] == 0;
}

/// Whether the chunked kernel takes p: dk 64 or 128, dv a multiple of its 64-column tile, and
/// mixed, out and ssm_state 16-byte aligned (its vector loads and stores).
bool chunked_supports(const GatedDeltaRuleParams& p);

/// The chunked form over the sequences of at least min_len tokens (others are left alone); p
/// checked by the caller and chunked_supports(p).
void launch_chunked(const GatedDeltaRuleParams& p, int min_len, cudaStream_t stream);

}  // namespace moebatch::kernels::gdn
