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
// kBatch 1 runs there (kCombineBatchMaxTokens). The fused kernel's many-token form instead stages
// the pairs and the rows in shared memory (combine8_staged), which frees the registers.
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

/// One pair of a token as the combine reads it: its expert_out row (-1: another rank's expert,
/// not summed) and its weight (1 without weights).
struct CombinePair {
  int row;
  float w;
};

template <bool kMasked>
__device__ __forceinline__ CombinePair combine_pair(const MoeCombineParams& p, size_t pair) {
  if constexpr (kMasked) {
    if (static_cast<unsigned>(p.topk_ids[pair] - p.expert0) >= static_cast<unsigned>(p.num_local)) return {-1, 1.f};
  }
  return {p.row_of_pair ? p.row_of_pair[pair] : static_cast<int>(pair), p.weights ? p.weights[pair] : 1.f};
}

// combine8's sum — the same fmaf per pair, in j order, not-live pairs skipped, so the same fp32
// bits — with the token's pairs read from shared memory (`pairs`, staged once per block: top_k
// of them, then row -1 up to a multiple of kCombineBatch) and each batch's rows copied by
// cp.async into this thread's kCombineBatch 16-byte slots of shared memory (`stage`, `stride`
// uint4 apart) rather than into registers: all of a batch's row loads (128 bytes a thread) are in
// flight before the first FMA at 48 registers. A thread reads back only its own slots,
// so the wait for its own copies orders them; the asm statements carry memory clobbers so the
// compiler keeps a batch's slot reads between that wait and the next batch's copies.
__device__ __forceinline__ void combine8_staged(const MoeCombineParams& p, const CombinePair* pairs, int c,
                                                uint4* stage, int stride, float acc[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int j0 = 0; j0 < p.top_k; j0 += kCombineBatch) {
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const int row = pairs[j0 + b].row;
      if (row < 0) continue;
      const unsigned slot = static_cast<unsigned>(__cvta_generic_to_shared(stage + b * stride));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(slot),
                   "l"(p.expert_out + static_cast<size_t>(row) * p.hidden + c)
                   : "memory");
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#pragma unroll 1  // one slot read live at a time: unrolled, the reads hoist into 32 registers
    for (int b = 0; b < kCombineBatch; ++b) {
      const CombinePair pr = pairs[j0 + b];
      if (pr.row < 0) continue;
      float v[8];
      unpack8(stage[b * stride], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(pr.w, v[i], acc[i]);
    }
  }
}

// r = bf16(r + bf16(acc)), ss += r² column by column: the combine rounded as moe_combine stores
// it, the add rounded as the residual stream is stored (combine_add8's last step, and the
// many-token kernel's).
__device__ __forceinline__ void combine_round_add8(const float acc[8], float r[8], float& ss) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float o = __bfloat162float(__float2bfloat16(acc[k]));
    r[k] = __bfloat162float(__float2bfloat16(r[k] + o));
    ss += r[k] * r[k];
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
  combine_round_add8(acc, r, ss);
}

}  // namespace moebatch::kernels
