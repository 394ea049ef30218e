// RMSNorm over rows, optionally fused with the residual add that precedes it in every
// transformer block (one read of each input instead of two passes).
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Operands of rmsnorm / add_rmsnorm. Rows are contiguous with `cols` elements.
struct RmsNormParams {
  bf16* out = nullptr;            ///< [rows, cols] normalized output; may alias `in`
  const bf16* in = nullptr;       ///< [rows, cols] input (add_rmsnorm: the branch output)
  bf16* residual = nullptr;       ///< [rows, cols] add_rmsnorm only: residual += in, in place
  const bf16* weight = nullptr;   ///< [cols]
  int rows = 0;
  int cols = 0;                   ///< multiple of 8
  float eps = 1e-6f;
  float weight_offset = 0.f;      ///< weight applied as (weight_offset + w): 1 for zero-centred
                                  ///< norms (Qwen3-Next)
};

/// out = in * rsqrt(mean(in^2) + eps) * (weight_offset + weight) (fp32 math, one bf16 rounding at the end).
void rmsnorm(const RmsNormParams& p, cudaStream_t stream);

/// residual = bf16(residual + in); out = rmsnorm(residual) * weight. The sum is rounded to bf16
/// before the norm, as the residual stream is stored in bf16.
void add_rmsnorm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
