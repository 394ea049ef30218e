// The one place GEMMs on weights choose their kernel by the weight's storage format (vLLM's
// quant_method per linear, calm's single dtype switch): bf16 weights go to cuBLAS; FP8-block and
// NVFP4 weights to the decode GEMV or, for many rows, decoded once into a scratch and cuBLAS
// (kernels/quant.cuh); every format to the grouped expert GEMM, which decodes in registers. A
// format without a kernel fails loudly here, naming the format. A new format (GGUF k-quants)
// adds a case to each switch.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/cuda/cuda_model.h"
#include "kernels/gemm_fp8.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_wgmma.cuh"

namespace moebatch {

/// The cuBLAS handle and stream one rank's GEMMs run on.
struct GemmContext {
  cublasHandle_t cublas = nullptr;  ///< the rank's handle (with its fixed workspace)
  cudaStream_t stream = nullptr;    ///< the rank's stream
  bf16* scratch = nullptr;          ///< decoded compressed weight of a many-row dense GEMM
  size_t scratch_elems = 0;         ///< dequant_scratch_elems of the rank's weights
  /// Pointer arrays of the grouped expert GEMMs: kGroupedStages regions of 3 · group_cap
  /// entries, pinned host (staging) and device (what cuBLAS reads).
  const void** group_ptrs_host = nullptr;
  const void** group_ptrs_dev = nullptr;
  int group_cap = 0;                ///< problems per region (the rank's experts)
  /// One-row bf16 projections on kernels::gemv_stream (the rank's Hopper GPU has it and it was
  /// prepared there) instead of quant_linear's GEMV.
  bool stream_gemv = false;
  /// Expert GEMMs of decode steps that kernels::moe_gemm_tma takes (bf16, W8A8) on it (the
  /// rank's Hopper GPU has it and moe_wgmma_prepare ran there) instead of moe_gemm.
  bool tma_experts = false;
  /// Projections on FP8-block weights with block_scales and more than kernels::kGemvMaxRows
  /// rows run W8A8 here (the rows quantized per 1 × 128 into `a8`) but for prefill-sized calls
  /// with inputs wider than 2048 (linear.cpp: measured slower there); null, or those: decoded
  /// to bf16 for cuBLAS (kernels::quant_linear).
  kernels::Fp8BlockGemm* fp8_gemm = nullptr;
  uint8_t* a8 = nullptr;  ///< w8a8_linear_bytes of the rank's plan and step capacity
  size_t a8_bytes = 0;
  /// gemv_stream lets the next kernel launch at its start (CudaBackendOptions::pdl_trigger_early).
  bool pdl_trigger_early = false;
};

/// Regions of GemmContext's pointer arrays: the gate+up and the down GEMM of one MoE layer are
/// in flight together (the next layer's offsets sync waits for both).
constexpr int kGroupedStages = 2;

/// out [rows, w.shape[0]] = in [rows, w.shape[1]] · wᵀ, bf16 output, fp32 accumulation.
void linear(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w, int rows);
/// Same with fp32 output (router logits, lm_head logits).
void linear(const GemmContext& g, float* out, const bf16* in, const DeviceTensor& w, int rows);
/// Whether linear runs `rows` rows times `w` on kernels::gemv_stream (one-row bf16 projections
/// where the rank has it), so that a caller may take that kernel's fused variants instead.
bool linear_on_gemv_stream(const GemmContext& g, const DeviceTensor& w, int rows);

/// Grouped expert GEMM with the routing operands of `p` (out, in, sorted ids, offsets, sizes)
/// and the stacked expert weights `w` ([E, n, k], or [E, 2n, k] with p.silu_gate_up), on g's
/// stream. A call of `tokens` tokens with the active-expert list takes the grouped GEMV
/// (kernels::moe_gemv) when that is the faster kernel for so few tokens (linear.cpp); more tokens
/// take the tiled GEMM: kernels::moe_gemm_tma where g.tma_experts and it takes the operands
/// (bf16, W8A8), else kernels::moe_gemm.
void expert_gemm(const GemmContext& g, kernels::MoeGemmParams p, const DeviceTensor& w, int tokens);

/// One token's down stage with the MoE combine and the residual add in the same launch
/// (kernels::moe_gemv_combine: residual += bf16(Σ weights[i] · y_i), bitwise the separate path's
/// on the CUDA-core walk — 4-bit experts leave their tensor-core walk here), where that kernel
/// takes `p` on the weights `w` [E, n, k]; false (nothing launched) where it does not.
bool expert_gemv_combine(const GemmContext& g, kernels::MoeGemmParams p, const DeviceTensor& w, bf16* residual,
                         const float* weights);

/// Expert GEMMs of a many-token step on rows in moe_align's sorted order: for each expert e
/// with rows, out[offsets[e] .. offsets[e+1]) = in[same rows] · w[e]ᵀ (bf16: one cuBLAS grouped
/// GEMM over the experts, pointer region `stage`; compressed weights: quant_linear per expert,
/// decoded into the scratch). `offsets` are the host copy of the align's [num_experts + 1]
/// offsets; w [E, n, k].
void expert_gemm_sorted(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w,
                        const int32_t* offsets, int stage);

/// The same on Hopper's wgmma kernel (kernels::moe_wgmma), from the device's offsets: `p` has
/// every operand but the weights, taken from `w` [E, n, k]. bf16 experts in one launch;
/// compressed experts decoded kDequantExperts at a time into the scratch (every expert of the
/// batch: the host does not know which have rows), one launch per batch over its slice of the
/// offsets. Nothing comes to the host.
void expert_gemm_wgmma(const GemmContext& g, kernels::MoeWgmmaParams p, const DeviceTensor& w);

/// e4m3 rows [rows, cols] and their fp32 scales per row and 128 columns (kernels::moe_wgmma_fp8's
/// activations), carved from a step buffer.
struct Fp8Rows {
  uint8_t* data = nullptr;  ///< [rows, cols]
  float* scales = nullptr;  ///< [rows, ceil(cols / 128)]
};

/// Bytes Fp8Rows of [rows, cols] take (the values padded to 256 bytes, then the scales).
size_t fp8_rows_bytes(int64_t rows, int cols);

/// Lays out Fp8Rows for [rows, cols] in `bytes` bytes at `buf` (Error when they do not fit).
Fp8Rows carve_fp8_rows(void* buf, size_t bytes, int64_t rows, int cols);

/// Whether a layer's many-token expert GEMMs can run W8A8 on FP8 tensor cores
/// (expert_gemm_wgmma_fp8): both stacks FP8 blocks of kernels::kWgmmaFp8Group inputs, with
/// sizes the kernel takes (k and output columns multiples of 16).
bool w8a8_experts(const DeviceTensor& gate_up, const DeviceTensor& down);
/// The same decided on a layer's weight plan, before anything is loaded.
bool w8a8_experts(const TensorPlan& gate_up, const TensorPlan& down);

/// Whether expert_gemm of a step with `tokens` tokens runs W8A8 (MoeGemmParams::in_fp8: the
/// grouped GEMM on FP8 tensor cores): w8a8_experts, k of both stacks a multiple of
/// kernels::kMoeGemmA8Group, and more tokens than the grouped GEMV takes (it keeps bf16 rows).
bool expert_gemm_w8a8(const DeviceTensor& gate_up, const DeviceTensor& down, int tokens);

/// expert_gemm_wgmma for FP8-block experts and e4m3 activations (kernels::moe_wgmma_fp8): `p`
/// has every operand but the weights and their scales, taken from `w` [E, n, k].
void expert_gemm_wgmma_fp8(const GemmContext& g, kernels::MoeWgmmaFp8Params p, const DeviceTensor& w);

/// Bytes of GemmContext::a8 for steps of up to `rows` tokens under weight plan `plan`: the
/// e4m3 rows and scales of the widest FP8-block projection input (0 without one).
size_t w8a8_linear_bytes(const ModelPlan& plan, int64_t rows);

/// Elements of the scratch the GEMMs of a rank with weight plan `plan` need: the largest
/// compressed 2-D weight or single expert matrix (0 when every weight is bf16).
size_t dequant_scratch_elems(const ModelPlan& plan);

}  // namespace moebatch
