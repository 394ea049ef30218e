// Compressed weights kept compressed: which weight tensors a GPU backend stores as FP8 blocks,
// NVFP4 or GGUF's integer formats instead of bf16, and reading a checkpoint's compressed tensors
// into those device forms without loss. The layouts (also in kernels/weight_codec.cuh, which
// decodes them):
//
//   Fp8Block  data e4m3 [rows, cols]; scales f32 [rows, ceil(cols / group)]
//   Nvfp4     data u8 [rows, cols / 2] (low nibble first); scales e4m3 [rows, cols / 16];
//             row_scales f32 [rows]
//   Int8      data i8 [rows, cols]; scales and mins f32 [rows, cols / group], group 16 or 32
//   Int4      data u8 [rows, cols / 2] (low nibble first); scales and mins f32 [rows, cols / 32]
//
// GGUF's ggml blocks (engine/ggml_quants.h) become Int4 (Q4_K) or Int8 (Q8_0, Q5_K, Q6_K; a
// tensor fused from pieces of several ggml formats: Int8 with groups of 16, which every
// sub-block covers): codes re-laid by rows, each sub-block's scale and min spelled out as the
// exact fp32 products ggml forms. Q4_K takes 0.75 bytes per weight this way (0.56 in the file),
// Q6_K 1.5 (0.82): the price of kernels that read one scale and min per 16-byte load.
//
// rows = every dim but the last, flattened (stacked experts included). Scales are kept per row
// rather than per 128-row block so that the row blocks of a weight plan (q/k/v fused, gate and
// up stacked, tensor-parallel row slices, experts stacked) land where they are without
// re-blocking: the checkpoint's block scale is repeated for each of its rows (3% more bytes than
// the checkpoint's FP8, none for NVFP4, whose scales are per row already). A column slice
// (row-parallel o_proj / down_proj) must start on a scale group: the loader refuses one that
// cuts an FP8 block, naming the tensor and the remedy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_config.h"
#include "engine/weight_source.h"
#include "engine/weights.h"

namespace moebatch {

/// What the GPU backend does with the weights of linear layers (vLLM's --quantization).
enum class Quantization {
  Auto,   ///< keep the checkpoint's compressed weights compressed; plain ones stay bf16
  None,   ///< decode everything to bf16
  Fp8,    ///< Auto, and quantize plain (bf16) linear weights to FP8 with per-row 128-input scales
  Nvfp4,  ///< Auto, and quantize plain linear weights to NVFP4
  Int4,   ///< Auto, and quantize plain linear weights to Int4 (GGUF Q4_K's form on the GPU)
};

/// "auto", "none", "fp8", "nvfp4", "int4" (InputError otherwise, listing them).
Quantization parse_quantization(std::string_view s);
const char* quantization_name(Quantization q);

/// Bytes of the arrays of a [rows, cols] matrix in format f.
struct PackedSizes {
  size_t data = 0;        ///< values
  size_t scales = 0;      ///< Fp8Block: f32 per group; Nvfp4: e4m3 per 16 inputs
  size_t row_scales = 0;  ///< Nvfp4: f32 per row
  size_t mins = 0;        ///< Int8, Int4: f32 per group
  size_t total() const { return data + scales + row_scales + mins; }
};
PackedSizes packed_sizes(WeightFormat f, int64_t rows, int64_t cols, int group);

/// [rows, cols] of a plan's destination (every dim but the last flattened into rows).
int64_t plan_rows(const TensorPlan& p);
int64_t plan_cols(const TensorPlan& p);

/// Sets format and group of every tensor of `plan`. Only the weights of linear layers (q/k/v,
/// o_proj, MLP and expert projections) may be compressed; embeddings, norms, biases, routers and
/// the lm_head stay bf16. With `src` (a checkpoint): a tensor whose pieces are all stored as FP8
/// blocks (or all as NVFP4, or all as ggml integer blocks: Int4 / Int8 above) keeps that form;
/// with Fp8 / Nvfp4 the other linear weights are
/// quantized (and every linear weight of a random model, src == nullptr). None: all bf16. A
/// shape the kernels cannot take compressed (columns not a multiple of 32) stays bf16.
/// InputError (naming the tensor) for a column slice that cuts an FP8 block.
void assign_weight_formats(ModelPlan& plan, const ModelConfig& cfg, const WeightSource* src,
                           Quantization q);

/// The formats each weight group of `plan` is held in, for start-up logs and /metrics:
/// "attention fp8, experts fp8, dense mlp bf16" (groups absent from the model left out; a group
/// in several formats lists them, "attention nvfp4+bf16"). Embeddings, norms, routers and the
/// lm_head are always bf16 and not listed.
std::string describe_weight_groups(const ModelPlan& plan);

/// A packed matrix on the host, in the layout of its format.
struct PackedHost {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
  std::vector<float> row_scales;
  std::vector<float> mins;
};

/// True when the checkpoint stores every piece of `plan` in plan.format (read it with
/// read_plan_packed); false when the pieces are plain and must be quantized.
bool stored_as_planned(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan);

/// Reads `plan`'s pieces in their stored compressed form (stored_as_planned) into `out`.
void read_plan_packed(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan,
                      PackedHost& out);

/// Decoded value of element (r, c) of a packed [rows, cols] matrix (tests, references).
float packed_value(WeightFormat f, const PackedHost& m, int64_t cols, int group, int64_t r,
                   int64_t c);

}  // namespace moebatch
