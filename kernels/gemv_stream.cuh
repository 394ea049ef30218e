// The dense decode GEMV on bf16 weights as a persistent stream (Hopper, sm_90a): one CTA per SM
// (as many as fit) owns a contiguous range of weight rows and streams their bytes through a
// shared-memory ring with 1-D bulk copies (TMA), so an SM keeps the same bytes in flight from
// its first cycle to its last instead of ramping down as short-lived warps retire (ncu on
// gemv_quant's bf16 qkv at one row: 44% of DRAM bandwidth, warps stalled on their loads;
// docs/design.md, session 8). The engine takes it for one-row bf16 projections
// (CudaBackendOptions::stream_gemv): qkv 9.7 → 9.2 µs, o_proj 11.9 → 8.2 µs by ncu on one H200.
// Other GPUs, and builds without the sm_90a target, have no such kernel: gemv_stream_available
// says which.
#pragma once

#include "kernels/moe_ops.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Whether gemv_stream runs on `device`: this build holds its sm_90a code and the device is a
/// compute capability 9.0 GPU (H100 / H200).
bool gemv_stream_available(int device);

/// Whether gemv_stream takes m activation rows of k on the current device: k % 8 == 0, and x
/// plus four one-row stages fit in its shared memory (see gemv_stream). false in a build
/// without the sm_90a code.
bool gemv_stream_fits(int m, int k);

/// Raises the kernels' dynamic shared-memory limit to the current device's opt-in maximum: once
/// per device before the first gemv_stream there (outside graph capture).
void gemv_stream_prepare();

/// out [m, n] = x [m, k] · Wᵀ for bf16 W [n, k] and 1 ≤ m ≤ kGemvMaxRows (kernels/quant.cuh):
/// fp32 products and accumulation, one rounding at the end, as gemv_quant. k % 8 == 0 (rows of
/// whole 16-byte granules); x and W 16-byte aligned; m · k · 2 bytes of x plus a ring of four
/// stages of at least one row each must fit in the device's shared memory (227 KB on an H100 /
/// H200: k ≤ 9680 at m = 8, 23232 at m = 1). Launched dependent (kernels/launch.cuh): the first
/// weight stages are in flight before the kernel before it has finished. Requires
/// gemv_stream_available and gemv_stream_prepare for the current device. m == 0 does nothing.
/// trigger_early: the next kernel may launch at this one's start (kernels/launch.cuh,
/// pdl_trigger_early) — the caller knows what follows.
void gemv_stream(bf16* out, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream,
                 bool trigger_early = false);
/// Same with fp32 output.
void gemv_stream(float* out, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream,
                 bool trigger_early = false);

/// Whether gemv_stream_combine_norm takes hidden size k on the current device (k % 8 == 0,
/// k ≤ kGemvCombineNormMaxK, and the ring fits beside x).
constexpr int kGemvCombineNormMaxK = 4096;
bool gemv_stream_combine_norm_fits(int k);

/// gemv_stream of one token whose x is the pending MoE combine added into the residual and
/// normalised, formed inside the GEMV instead of by moe_combine_add_rmsnorm's one-block launch
/// before it: every CTA computes x = rmsnorm(residual + bf16(Σ_j w_j · y_j)) · (weight_offset +
/// weight) itself (the same arithmetic, the sum of squares in another order), and the CTA that
/// is last to take a ticket on `counter` (zero before, left zero) — when every CTA has read the
/// residual — writes residual += the combine back in place. c.tokens == 1, c.hidden == norm.cols
/// == k, no expert-parallel mask (c.topk_ids null); norm.out is not written. The decode layer's
/// first norm at batch 1, one launch less on its critical path (docs/design.md, session 19).
/// c.top_k 0: no expert rows — the residual already holds the sum (moe_gemv_combine) — so x is
/// the residual's norm, each CTA reads only that row, and nothing is written back (no ticket).
void gemv_stream_combine_norm(bf16* out, const MoeCombineParams& c, const RmsNormParams& norm,
                              unsigned* counter, const bf16* w, int n, int k, cudaStream_t stream,
                              bool trigger_early = false);

}  // namespace moebatch::kernels
