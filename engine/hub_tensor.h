// Reading one hub tensor's elements whatever the checkpoint stores: plain BF16/F16/F32,
// fine-grained FP8 (F8_E4M3 + weight_scale_inv per block), ModelOpt NVFP4 (U8 pairs of E2M1
// codes + F8_E4M3 scale per 16 inputs + F32 weight_scale_2), or GGUF's ggml blocks (Q8_0,
// k-quants; decoded a row at a time). Everything about the stored form is
// checked against the config when the reader is made (dtype, shapes of the weight and of its
// scales, exclude_modules), so a mismatch is an InputError naming the tensor before any data is
// read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace moebatch {

/// The stored form of one hub tensor.
enum class StoredAs { Plain, Fp8Block, Nvfp4, GgmlBlocks };

/// Decodes elements of hub tensor `name`, whose shape the config implies as `shape`
/// ([rows, cols]; 1-D tensors as [n, 1], N-D ones as [shape[0], product of the rest]).
class HubTensorReader {
 public:
  HubTensorReader(const WeightSource& src, const ModelConfig& cfg, const std::string& name,
                  const std::vector<int64_t>& shape);
  /// Element (r, c) of the hub tensor, dequantized to float.
  float at(int64_t r, int64_t c) const;
  /// How the checkpoint stores it.
  StoredAs stored_as() const { return kind_; }

  // The stored form as it is, for loaders that keep compressed weights compressed
  // (engine/packed_weights.h). Fp8Block, Nvfp4 and GgmlBlocks only.
  /// Bytes of row r (Fp8Block: cols E4M3 bytes; Nvfp4: cols / 2 bytes, low nibble first;
  /// GgmlBlocks: cols / block elements ggml blocks).
  const uint8_t* stored_row(int64_t r) const;
  /// The file tensor's dtype (GgmlBlocks: the ggml format).
  DType stored_dtype() const { return t_->dtype; }
  /// Fp8Block: the scale of the block holding element (r, c).
  float block_scale(int64_t r, int64_t c) const;
  /// Fp8Block: columns per scale block.
  int64_t block_cols() const { return bc_; }
  /// Nvfp4: the E4M3 scale byte of inputs [16 g, 16 g + 16) of row r.
  uint8_t group_scale_byte(int64_t r, int64_t g) const;
  /// Nvfp4: weight_scale_2.
  float global_scale() const { return scale2_; }

 private:
  StoredAs kind_ = StoredAs::Plain;
  const TensorView* t_ = nullptr;
  int64_t row0_ = 0, cols_ = 0;
  const TensorView* scale_ =
      nullptr;  // FP8: [ceil(rows/br), ceil(cols/bc)]; NVFP4: [rows, cols/16]
  int64_t br_ = 0, bc_ = 0, scale_cols_ = 0;
  float scale2_ = 1.0f;             // NVFP4 weight_scale_2
  mutable std::vector<float> row_;  // ggml blocks: the last decoded row
  mutable int64_t row_index_ = -1;
};

/// Value of an E2M1 code (bit 3 sign; bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6).
float e2m1_to_f32(uint8_t code);

}  // namespace moebatch
