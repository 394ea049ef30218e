// Dense projections on compressed weights (kernels/weight_codec.cuh: FP8 blocks, NVFP4; bf16
// activations), and the quantizers that build such weights on the GPU.
//
// quant_linear is the one place the dense path is chosen by shape:
//   bf16 weights           → cuBLAS (kernels::linear), but gemv_quant for one row (bench/RESULTS.md
//                            2026-12-01: qkv 13.5 vs 18.9 µs, o_proj 14.0 vs 20.2 µs at 30B shapes)
//   m ≤ kGemvMaxRows rows  → gemv_quant: decode is weight-bandwidth bound (each weight byte is
//                            used by at most 8 rows), so the weights are streamed once and decoded
//                            in registers, never written out
//   more rows              → dequantize into a bf16 scratch, then cuBLAS: the one decode pass is
//                            amortized over many rows and the GEMM runs on tensor cores
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

#include "kernels/types.cuh"
#include "kernels/weight_codec.cuh"

namespace moebatch::kernels {

/// Most activation rows gemv_quant takes (the decode batch it serves).
constexpr int kGemvMaxRows = 8;

/// How quant_linear computes one call.
enum class QuantLinearPath { Cublas, Gemv, DequantCublas };

/// The path quant_linear takes for `codec` weights and m activation rows (also what the op
/// cases name and tolerate by).
constexpr QuantLinearPath quant_linear_path(WeightCodec codec, int m) {
  return codec == WeightCodec::Bf16 ? (m == 1 ? QuantLinearPath::Gemv : QuantLinearPath::Cublas)
         : m <= kGemvMaxRows        ? QuantLinearPath::Gemv
                                    : QuantLinearPath::DequantCublas;
}

/// "cuBLAS", "gemv", "dequant+cuBLAS".
const char* quant_linear_path_name(QuantLinearPath p);

/// out [m, n] = x [m, k] · Wᵀ for W [n, k] in any codec and m ≤ kGemvMaxRows: one warp streams
/// 2 or 4 rows of W in 16-byte granules, fp32 accumulation, one rounding at the end (the Nvfp4
/// row scale applied to the fp32 sum). k % codec_granule(codec) == 0 (bf16 8, fp8 16, nvfp4
/// 32); x, W data 16-byte aligned. m == 0 does nothing.
void gemv_quant(bf16* out, const bf16* x, const QuantMatrix& w, int m, int n, int k,
                cudaStream_t stream);
/// Same with fp32 output.
void gemv_quant(float* out, const bf16* x, const QuantMatrix& w, int m, int n, int k,
                cudaStream_t stream);

/// out [rows, cols] bf16 = the decoded values of w (Fp8Block: bf16(e4m3 · scale); Nvfp4:
/// bf16(float(e2m1 · group scale) · row scale), one rounding from fp32; Bf16: a copy).
/// cols % 16 == 0 (nvfp4: % 32).
void dequantize(const QuantMatrix& w, int64_t rows, int cols, bf16* out, cudaStream_t stream);

/// out [m, n] = x [m, k] · Wᵀ by quant_linear_path (above). `scratch` holds n · k bf16 for the
/// DequantCublas path (MB_CHECKed there; unused and may be nullptr otherwise). Binds `handle`
/// to `stream`.
void quant_linear(cublasHandle_t handle, cudaStream_t stream, bf16* out, const bf16* x,
                  const QuantMatrix& w, int m, int n, int k, bf16* scratch, size_t scratch_elems);
/// Same with fp32 output.
void quant_linear(cublasHandle_t handle, cudaStream_t stream, float* out, const bf16* x,
                  const QuantMatrix& w, int m, int n, int k, bf16* scratch, size_t scratch_elems);

/// FP8 block quantization of in [rows, cols] into the Fp8Block layout: per block of `row_block`
/// rows (counted from row 0; the last may be short) and group of `group` columns (the last group
/// of a row may be partial), scale = amax / 448 (1 when the block is all zero), repeated in each
/// of its rows, data = e4m3 round-to-nearest-even, saturating, of v / scale. row_block 1:
/// activations per token and group; 128: weights in 128 × 128 blocks, as FP8 checkpoints hold
/// them. data [rows, cols] bytes, scales [rows, ceil(cols / group)] f32, or with scales_ld > 0
/// (row_block 1, scales_ld ≥ rows) group-major [ceil(cols / group)][scales_ld], the activation
/// layout of kernels::Fp8BlockGemm. cols % 16, group % 16 == 0.
void quantize_fp8_rows(const bf16* in, int64_t rows, int cols, int group, uint8_t* data,
                       float* scales, cudaStream_t stream, int row_block = 1, int scales_ld = 0);

/// Whether every row's scales [rows, groups] equal those of the first row of its block of
/// `row_block` rows (counted from row 0). Synchronizes `stream` (a load-time check).
bool scales_block_uniform(const float* scales, int64_t rows, int groups, int row_block, cudaStream_t stream);

/// NVFP4 quantization of in [rows, cols] (ModelOpt's scheme with a per-row second-level scale):
/// row_scale = row amax / (448 · 6) (1 for an all-zero row); per 16 inputs the e4m3 group scale
/// = e4m3(group amax / (6 · row_scale)); codes = nearest E2M1 of v / (group scale · row_scale),
/// ties to the even code (as cvt.rn), sign bit only on a nonzero magnitude; a group whose scale
/// rounds to 0 gets zero codes. data [rows, cols / 2] (even column in the low nibble), scales
/// [rows, cols / 16] e4m3, row_scales [rows] f32. cols % 32 == 0.
void quantize_nvfp4_rows(const bf16* in, int64_t rows, int cols, uint8_t* data, uint8_t* scales,
                         float* row_scales, cudaStream_t stream);

/// Int4 quantization of in [rows, cols] (the form GGUF's Q4_K takes on the GPU, with exact fp32
/// scales): per 32 inputs with lo / hi their min / max, scale = (hi − lo) / 15 (1 when hi == lo),
/// min = −lo, code = clamp(rint((v − lo) / scale), 0, 15); so v ≈ code · scale − min. data
/// [rows, cols / 2] (even column in the low nibble), scales and mins [rows, cols / 32] f32.
/// cols % 32 == 0.
void quantize_int4_rows(const bf16* in, int64_t rows, int cols, uint8_t* data, float* scales,
                        float* mins, cudaStream_t stream);

}  // namespace moebatch::kernels
