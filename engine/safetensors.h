// Safetensors reading (mmap, single file or sharded via model.safetensors.index.json) and a small
// writer for float32/int32 outputs. Every header is validated before any tensor is touched:
// header size cap, JSON shape, dtype known, offsets inside the data section, no overlap, and
// end - begin == numel * dtype size. Errors are InputError naming the file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/weight_source.h"

namespace moebatch {

/// Element types a checkpoint may hold: safetensors dtypes, and the GGUF block formats (ggml's
/// Q8_0 and k-quants; engine/ggml_quants.h), which store blocks of elements rather than elements.
enum class DType { F32, F16, BF16, F8_E4M3, I32, I64, U8, Q8_0, Q4_K, Q5_K, Q6_K };

/// Elements per block and bytes per block of `t` (1 and the element size for plain dtypes).
struct DTypeBlock {
  int64_t elems = 1;  ///< elements per block
  int64_t bytes = 0;  ///< bytes per block
};
DTypeBlock dtype_block(DType t);
/// True for block formats (Q8_0, Q4_K, Q5_K, Q6_K).
inline bool dtype_is_block(DType t) { return dtype_block(t).elems > 1; }

/// Bytes per element of `t` (plain dtypes only; 0 for block formats).
size_t dtype_size(DType t);
/// Safetensors spelling of `t` ("BF16", ...).
const char* dtype_name(DType t);

/// Widening conversions used by every loader path (exact for all inputs; NaN stays NaN).
float bf16_to_f32(uint16_t v);
float f16_to_f32(uint16_t v);
float fp8_e4m3_to_f32(uint8_t v);
/// Round-to-nearest-even narrowing, for backends that store bf16.
uint16_t f32_to_bf16(float v);

/// A tensor inside a mapped file: metadata plus a pointer to its bytes (valid while the file
/// lives).
struct TensorView {
  std::string name;                 ///< hub name, e.g. model.layers.0.self_attn.q_proj.weight
  DType dtype = DType::F32;         ///< element type on disk
  std::vector<int64_t> shape;       ///< dims, outermost first
  const std::byte* data = nullptr;  ///< first byte (unaligned in general)
  size_t nbytes = 0;                ///< numel * dtype_size
  std::string file;                 ///< file it lives in, for messages

  /// Number of elements.
  int64_t numel() const;
  /// Element `i` widened to float (floating dtypes, I32, and block formats — these decode the
  /// element's whole block, so read rows with dequantize_row instead when speed matters).
  float get_f32(int64_t i) const;
};

/// One memory-mapped .safetensors file with a validated header.
class SafetensorsFile {
 public:
  /// Maps and validates `path`; throws InputError on any malformation.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  /// Tensors by name.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  /// The tensor `name`, or InputError naming file and tensor.
  const TensorView& at(const std::string& name) const;
  /// Path as opened.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

/// All tensors of a checkpoint directory: one file, or the shards named by the index. Hub
/// names map onto themselves.
class Checkpoint final : public WeightSource {
 public:
  /// Opens `dir/model.safetensors.index.json` if present, else `dir/model.safetensors`.
  explicit Checkpoint(const std::filesystem::path& dir);

  /// True when the checkpoint holds `name`.
  bool has(const std::string& name) const;
  /// The tensor `name`, or InputError naming the checkpoint and tensor.
  const TensorView& at(const std::string& name) const;
  /// The directory opened.
  const std::string& dir() const { return dir_; }

  const std::string& source_name() const override { return dir_; }
  bool has_tensor(const std::string& name) const override { return has(name); }
  SourceTensor find_tensor(const std::string& name) const override {
    const TensorView& t = at(name);
    return {&t, 0, t.shape};
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

/// A tensor to write: float32 or int32 data with its shape.
struct OutTensor {
  std::string name;                  ///< key in the file
  std::vector<int64_t> shape;        ///< dims
  DType dtype = DType::F32;          ///< F32 or I32
  std::span<const std::byte> bytes;  ///< numel * 4 bytes
};

/// Writes a .safetensors file (header padded to 8 bytes); throws Error on I/O failure.
void write_safetensors(const std::filesystem::path& path, const std::vector<OutTensor>& tensors);

}  // namespace moebatch
