// Dense projections on FP8 tensor cores with DeepSeek-style block scales, through cuBLASLt
// (cuBLAS ≥ 12.9 on Hopper: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F for the weights,
// VEC128_32F for the activations): out = (x · sx) · (w · sw)ᵀ with x e4m3 rows quantized per
// 1 × 128 and w the checkpoint's e4m3 weights with one scale per 128 × 128 block. This is the
// W8A8 form vLLM and SGLang run block-FP8 checkpoints' dense layers in; the alternative it
// replaces, decoding the weight to bf16 for a bf16 GEMM, writes and re-reads twice the weight's
// bytes every call and multiplies at half the FP8 rate.
//
// Why a library here and our own kernels for the experts: the dense projections are plain
// GEMMs (no gather, no grouping), exactly what cuBLASLt tunes; the expert GEMMs need the token
// gather and per-expert row ranges, which no cuBLASLt call takes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Rows per activation scale block and rows / columns per weight scale block.
constexpr int kFp8BlockGemmGroup = 128;

/// Floats per row of a weight's compact block-scale grid [ceil(n / 128)][ld]: cuBLASLt reads
/// the 128 × 128 scales with a row pitch padded to four (16 bytes).
inline int fp8_block_scale_ld(int k) { return ((k + kFp8BlockGemmGroup - 1) / kFp8BlockGemmGroup + 3) & ~3; }

/// Whether the device runs cuBLASLt's block-scaled FP8 GEMM (compute capability 9.0 only:
/// Blackwell takes other scale modes).
bool fp8_block_gemm_available(int device);

/// One rank's block-scaled FP8 GEMMs: a cuBLASLt handle, the workspace it may use (the buffer
/// the rank gave its cuBLAS handle — both run on the rank's one stream, never at once) and the
/// algorithm cuBLASLt's heuristic picked per shape and operand alignment. Not thread-safe: one
/// per rank thread.
class Fp8BlockGemm {
 public:
  Fp8BlockGemm(void* workspace, size_t workspace_bytes);
  ~Fp8BlockGemm();
  Fp8BlockGemm(const Fp8BlockGemm&) = delete;
  Fp8BlockGemm& operator=(const Fp8BlockGemm&) = delete;

  /// Whether run() takes [m, k] · [n, k]ᵀ: m a positive multiple of 4 (the activation scales'
  /// pitch), n and k multiples of 128 (whole scale blocks).
  static bool takes(int m, int n, int k);

  /// takes(m, n, k) and cuBLASLt has an algorithm for the shape with operands `out`, `x`, `w`
  /// as aligned as these (asked once per shape and alignment).
  bool supports(int m, int n, int k, const void* out, const void* x, const void* w);

  /// out [m, n] bf16 = Σ_c (x[i, c] · x_scales[c / 128][i]) · (w[j, c] · w_scales[j / 128][c / 128])
  /// with fp32 accumulation. x [m, k] and w [n, k] e4m3 row-major; x_scales [k / 128][m] (group
  /// major: kernels::quantize_fp8_rows with scales_ld = m writes them); w_scales
  /// [n / 128][fp8_block_scale_ld(k)] (compact_block_scales). supports(m, n, k); the pointers
  /// 16-byte aligned. Graph-capturable (no allocation; the heuristic runs on the host).
  void run(cudaStream_t stream, bf16* out, const uint8_t* x, const float* x_scales, const uint8_t* w,
           const float* w_scales, int m, int n, int k);

 private:
  struct Plan;
  const Plan& plan(int m, int n, int k, int alignment);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

/// The compact grid of a weight whose per-row scales [rows, groups] (the Fp8Block layout of
/// engine/packed_weights.h) are uniform over aligned 128-row blocks: out [ceil(rows / 128)][ld]
/// = the scales of rows 0, 128, 256, …, ld ≥ groups (the padding is left as it is). One 2-D
/// copy on `stream`.
void compact_block_scales(const float* row_scales, int64_t rows, int groups, float* out, int ld,
                          cudaStream_t stream);

}  // namespace moebatch::kernels
