// The expert GEMMs of many-token steps (prefill) on Hopper's warpgroup tensor-core instructions
// (bf16, and W8A8 for FP8-block experts):
// the routed rows gathered in moe_align's sorted order (moe_gather_sorted) times each expert's
// bf16 weights, every expert in one launch; the gate+up stage gathers the tokens' rows itself.
// Each block finds the expert of its row tile in
// moe_align's offsets on the device, so no offsets come to the host and nothing is launched per
// expert; the gate+up stage applies SiLU·mul to its fp32 accumulators and writes only the
// activations. Other GPUs, and builds without the sm_90a target, use expert_gemm_sorted's cuBLAS
// grouped GEMM (engine/cuda/linear.h) instead: moe_wgmma_available says which.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Operands of moe_wgmma. Expert e's rows are [expert_offsets[e], expert_offsets[e + 1]) of `in`
/// and `out`; rows past expert_offsets[num_experts] are neither read nor written.
struct MoeWgmmaParams {
  bf16* out = nullptr;                      ///< [rows_cap, silu_gate_up ? n / 2 : n]
  const bf16* in = nullptr;                 ///< [rows_cap, k] sorted rows
  const bf16* weight = nullptr;             ///< [num_experts, n, k] (Hugging Face [out, in] per expert)
  const int32_t* expert_offsets = nullptr;  ///< [num_experts + 1] from moe_align (device)
  int num_experts = 0;
  int n = 0;          ///< weight rows per expert; silu_gate_up: gate rows [0, n/2), up rows [n/2, n)
  int k = 0;          ///< multiple of 8
  int rows_cap = 0;   ///< ≥ expert_offsets[num_experts]: bounds the launch
  bool silu_gate_up = false;  ///< out = silu(x·gateᵀ) · (x·upᵀ), from the fp32 accumulators
  /// Gathered A rows (the gate+up stage reads the tokens' rows in place): row i of an expert's
  /// segment is in[sorted_ids[i] / in_row_div], zeros for padding ids (≥ num_pairs). Null: row i
  /// is in[i].
  const int32_t* sorted_ids = nullptr;
  int num_pairs = 0;
  int in_row_div = 1;
  /// With sorted_ids, optional [num_pairs]: row_of_pair[id] = i for every real pair (the map
  /// moe_combine reads the expert outputs through), as moe_gather_sorted writes it.
  int32_t* row_of_pair = nullptr;
  /// Sorted rows (no sorted_ids) brought by TMA, one 128-row box per slice beside the weights'
  /// boxes, instead of every thread's cp.async: no load instructions in the k loop (the engine's
  /// down stage: 5–6% faster there, bench/RESULTS.md 2026-12-04).
  bool tma_rows = false;
  /// Blocks of the persistent walk: 0 = one per SM; a few, to give each block many tiles (the
  /// op cases' check of a walk across tiles on small shapes).
  int max_blocks = 0;
};

/// Inputs per scale group of the W8A8 expert GEMM: FP8 block-128 weights (the checkpoint layout
/// and --quantization fp8's), activations quantized per row and 128 columns.
constexpr int kWgmmaFp8Group = 128;

/// Operands of moe_wgmma_fp8: W8A8, e4m3 rows and weights with fp32 scales per 128 inputs
/// (value = e4m3 · scale), the MMAs on FP8 tensor cores, each 128-wide k slice's fp32 partial
/// sums scaled by its row and weight scales into fp32 accumulators. Rows, tiles and gather as
/// MoeWgmmaParams. With silu_gate_up the output is the down stage's input, quantized the same
/// way: silu(gate)·up from the accumulators, per row and 128 output columns scale = amax / 448
/// (1 for an all-zero group), codes = e4m3(v / scale), round to nearest, saturating.
struct MoeWgmmaFp8Params {
  void* out = nullptr;            ///< bf16 [rows_cap, n]; silu_gate_up: e4m3 [rows_cap, n / 2]
  float* out_scales = nullptr;    ///< silu_gate_up: [rows_cap, ceil(n / 2 / 128)]
  const uint8_t* in = nullptr;    ///< e4m3 [.., k]: sorted rows, or the tokens' rows with sorted_ids
  const float* in_scales = nullptr;      ///< [.., ceil(k / 128)], the rows of `in`
  const uint8_t* weight = nullptr;       ///< e4m3 [num_experts, n, k]
  const float* weight_scales = nullptr;  ///< [num_experts · n, ceil(k / 128)] (per weight row)
  /// Weight rows sharing each scale, aligned from row 0: 1, or 128 (FP8 checkpoints' 128 × 128
  /// blocks; DeviceTensor::scale_rows says which) for one scale per 128-column half-tile and
  /// stage, a cheaper promotion (taken when n, and n / 2 with SiLU, are multiples of 128)
  int weight_scale_rows = 1;
  const int32_t* expert_offsets = nullptr;  ///< [num_experts + 1] from moe_align (device)
  int num_experts = 0;
  int n = 0;  ///< weight rows per expert; silu_gate_up: gate rows [0, n/2), up rows [n/2, n)
  int k = 0;  ///< multiple of 16
  int rows_cap = 0;
  bool silu_gate_up = false;
  const int32_t* sorted_ids = nullptr;  ///< as MoeWgmmaParams
  int num_pairs = 0;
  int in_row_div = 1;
  int32_t* row_of_pair = nullptr;
  /// Blocks of the persistent walk: 0 = one per SM; a few, to give each block many tiles (the
  /// op cases' check of a walk across tiles on small shapes).
  int max_blocks = 0;
};

/// Whether moe_wgmma runs on `device`: this build holds its sm_90a code and the device is a
/// compute capability 9.0 GPU (H100 / H200).
bool moe_wgmma_available(int device);

/// Raises the kernels' shared-memory limits on the current device: once per device before the
/// first moe_wgmma, moe_wgmma_fp8 or moe_gemm_tma there (outside graph capture).
void moe_wgmma_prepare();

/// out rows of every expert = in rows · W_eᵀ (SiLU·mul of the halves with silu_gate_up).
/// Requires moe_wgmma_available and moe_wgmma_prepare for the current device; n (n / 2 with
/// silu_gate_up) and k multiples of 8, 16-byte aligned operands.
void moe_wgmma(const MoeWgmmaParams& p, cudaStream_t stream);

/// Diagnostic builds (MOEBATCH_PHASE_CLOCKS, kernels/phase_clock.cuh): the cycles every bf16
/// moe_wgmma tile's warpgroups spent in each MoeWgmmaPhase since the last call, then the number
/// of warpgroup tiles summed (kWgmmaPhases + 1 values), and resets them. Other builds: empty.
std::vector<uint64_t> moe_wgmma_take_phase_clocks();
/// The same for moe_wgmma_fp8's tiles (MoeWgmmaFp8Phase; kFp8Phases + 1 values).
std::vector<uint64_t> moe_wgmma_fp8_take_phase_clocks();

/// The same for FP8 operands (MoeWgmmaFp8Params). Requires moe_wgmma_available and
/// moe_wgmma_prepare; k and the output columns (n / 2 with silu_gate_up) multiples of 16,
/// 16-byte aligned operands.
void moe_wgmma_fp8(const MoeWgmmaFp8Params& p, cudaStream_t stream);

namespace detail {
/// moe_wgmma_prepare's part for moe_wgmma_fp8 (kernels/moe_wgmma_fp8.cu).
void moe_wgmma_fp8_prepare();
/// moe_wgmma_prepare's part for moe_gemm_tma (kernels/moe_gemm_tma.cu).
void moe_gemm_tma_prepare();
}  // namespace detail

}  // namespace moebatch::kernels
