// The routed experts' weighted sum, one definition for every kernel that forms it
// (kernels/moe_ops.cu's combine kernels, and gemv_stream's one-token prologue). Included only
// from .cu files.
#pragma once

#include <cstddef>

#include "kernels/device_common.cuh"
#include "kernels/moe_ops.cuh"

namespace moebatch::kernels {

// acc = Σ_j w[t, j] · y[pair row] over columns c .. c + 7 of token t, in j order (the one
// definition of the combine's sum: moe_ops.cu's kernels, gemv_stream's one-token prologue).
// kMasked (expert parallel): pairs of
// other ranks' experts are skipped, not multiplied by zero: their expert_out rows were never
// written and may hold NaN.
// kBatch > 1: loads go out in batches of kBatch pairs — first every pair's row index and weight,
// then every row's 16 bytes — so a token costs two dependent round trips per batch rather than
// two per pair. That pays where few tokens leave the SMs idle (decode: at one token this kernel is
// on the critical path of every layer; batch 1 step −3.5%); with thousands of tokens (prefill) the
// registers it takes cost more in resident blocks than it saves (8 × 1024: 5.2 → 6.4 ms), and
// kBatch 1 runs there (kCombineBatchMaxTokens).
constexpr int kCombineBatch = 8;
constexpr int kCombineBatchMaxTokens = 1024;
template <bool kMasked, int kBatch>
__device__ __forceinline__ void combine8(const MoeCombineParams& p, size_t t, int c, float acc[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int j0 = 0; j0 < p.top_k; j0 += kBatch) {
    size_t row[kBatch];
    float w[kBatch];
    bool live[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const size_t pair = t * p.top_k + j0 + b;
      live[b] = j0 + b < p.top_k;
      if constexpr (kMasked) {
        live[b] = live[b] &&
                  static_cast<unsigned>(p.topk_ids[pair] - p.expert0) < static_cast<unsigned>(p.num_local);
      }
      w[b] = live[b] && p.weights ? p.weights[pair] : 1.f;
      row[b] = live[b] && p.row_of_pair ? static_cast<size_t>(p.row_of_pair[pair]) : pair;
    }
    uint4 y[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (live[b]) y[b] = *reinterpret_cast<const uint4*>(p.expert_out + row[b] * p.hidden + c);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (!live[b]) continue;
      float v[8];
      unpack8(y[b], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[b], v[i], acc[i]);  // moe_gemv_combine sums alike
    }
  }
}

// r = bf16(residual + bf16(Σ_j w · y)) over columns c .. c + 7 of token t — the combine rounded
// as moe_combine stores it, the add rounded as the residual stream is stored — read from
// `residual` (those 8 columns), with ss += r² column by column as add_rmsnorm sums. The one
// definition of the combine + add for the kernels that also normalise (moe_ops.cu's
// moe_combine_add_rmsnorm, gemv_stream's one-token prologue), which must agree bit for bit.
template <bool kMasked, int kBatch>
__device__ __forceinline__ void combine_add8(const MoeCombineParams& p, size_t t, int c, const bf16* residual,
                                             float r[8], float& ss) {
  load8(residual, r);
  float acc[8];
  combine8<kMasked, kBatch>(p, t, c, acc);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float o = __bfloat162float(__float2bfloat16(acc[k]));
    r[k] = __bfloat162float(__float2bfloat16(r[k] + o));
    ss += r[k] * r[k];
  }
}

}  // namespace moebatch::kernels
