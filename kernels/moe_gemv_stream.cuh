// The one-token expert GEMV as a persistent stream (Hopper, sm_90a), for compressed experts
// (NVFP4, Int4, FP8 block): one CTA per SM streams a contiguous share of the token's experts'
// weight tiles through a shared-memory ring with bulk copies, and its consumer warps multiply
// each tile on tensor cores
// (the walk of kernels/gemv_mma_device.cuh, reading the tile from shared memory). moe_gemv's
// blocks each request their bytes once and wait for them, so its compressed GEMVs took ~8–9 µs
// (gate+up) and ~7.5 µs (down) a layer whatever their bytes (bench/RESULTS.md, session 20); here
// an SM keeps a ring's worth of bytes in flight from its first cycle to its last.
// CudaBackendOptions::stream_expert_gemv (off until measured faster).
#pragma once

#include "kernels/moe_gemm.cuh"

namespace moebatch::kernels {

/// Whether moe_gemv_stream takes p on the current device: this build has the sm_90a code, the
/// device is compute capability 9.0, the weights are Nvfp4, Int4 (group 32, with mins) or
/// Fp8Block (a group of 16 · j dividing k), p is one token's (direct_topk, no W8A8, `in`
/// 16-byte aligned), k % 128 == 0, and the ring's four stages of one 16-row tile fit in shared
/// memory (H100/H200: k ≤ 3456 for Fp8Block in groups of 128, 4736 for Int4, 6400 for Nvfp4).
/// With routing_settled the producer reads the expert ids before it waits: the kernel before
/// must be launched dependent and wait before it lets this one launch (pdl_sync does both).
bool moe_gemv_stream_takes(const MoeGemmParams& p);

/// Raises the kernels' dynamic shared-memory limit to the current device's opt-in maximum: once
/// per device before the first moe_gemv_stream there (outside graph capture).
void moe_gemv_stream_prepare();

/// moe_gemv of one token (tokens = 1) as a stream: the same operands and results as moe_gemv
/// with direct_topk (the experts from topk_ids in sorted_ids; with routing_settled the producer
/// reads them before waiting for the kernel before). Requires moe_gemv_stream_takes(p) and
/// moe_gemv_stream_prepare on the current device. Launched dependent (kernels/launch.cuh).
/// ctas_per_sm caps the CTAs an SM runs (0: as many as fit, ~3 for a 4-bit 30B tile; 1: one
/// CTA an SM walking twice the tiles, the measured alternative — bench/RESULTS.md).
void moe_gemv_stream(const MoeGemmParams& p, cudaStream_t stream, int ctas_per_sm = 0);

/// Whether gemv_quant_stream takes a one-row projection out [n] = W [n, k] · in [k] on the
/// current device: as moe_gemv_stream_takes for the weights and `in`, n % 16 == 0.
bool gemv_quant_stream_takes(const QuantMatrix& w, const bf16* in, int n, int k);

/// The same stream for one dense compressed projection of one row (the decode GEMV's
/// kernels::gemv_quant at rows = 1): the matrix is one "expert" whose tiles stream from the
/// kernel's first cycle (the weights are constants; only the consumers wait for `in`, as
/// gemv_stream does for bf16). Requires gemv_quant_stream_takes and moe_gemv_stream_prepare.
/// ctas_per_sm as for moe_gemv_stream.
void gemv_quant_stream(bf16* out, const bf16* in, const QuantMatrix& w, int n, int k, cudaStream_t stream,
                       int ctas_per_sm = 0);

}  // namespace moebatch::kernels
