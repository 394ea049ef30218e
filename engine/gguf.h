// GGUF files (llama.cpp's format, v3; v2 read too): a memory-mapped, fully validated reader.
// Every length, count, offset, alignment, type and dimension is checked against the file size
// before use — the published parser CVEs of this format are integer overflows in tensor sizes,
// string lengths and array counts, and out-of-range offsets. Split models
// (name-00001-of-00003.gguf) are opened as one. Errors are InputError naming file and key/tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/safetensors.h"

namespace moebatch {

/// One mapped .gguf file: its metadata and tensors (TensorView shapes outermost first, i.e. GGUF's
/// ne[] reversed: a [in, out] weight is shape [out, in]).
class GgufFile {
 public:
  /// Maps and validates `path`; InputError on any malformation.
  explicit GgufFile(const std::filesystem::path& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  /// Metadata key → value (numbers, strings, bools, arrays as JSON).
  const nlohmann::json& metadata() const { return meta_; }
  /// Tensors by GGUF name.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  /// Path as opened.
  const std::string& path() const { return path_; }
  /// Format version (2 or 3).
  uint32_t version() const { return version_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  nlohmann::json meta_ = nlohmann::json::object();
  std::map<std::string, TensorView> tensors_;
};

/// A GGUF model: one file or every part of a split model, with metadata from the first part.
class GgufModel {
 public:
  /// Opens `path` (a .gguf file; for "<name>-00001-of-000NN.gguf" every part).
  explicit GgufModel(const std::filesystem::path& path);
  /// Metadata of the first part.
  const nlohmann::json& metadata() const { return parts_.front()->metadata(); }
  /// The tensor `name`, or null.
  const TensorView* find(const std::string& name) const;
  /// Path of the first part.
  const std::string& path() const { return parts_.front()->path(); }
  /// A metadata value, or InputError naming the missing/mistyped key.
  const nlohmann::json& require(const std::string& key) const;

 private:
  std::vector<std::unique_ptr<GgufFile>> parts_;
  std::map<std::string, const TensorView*> index_;
};

/// True when `path` names a GGUF file (by extension).
bool is_gguf_path(const std::filesystem::path& path);

}  // namespace moebatch
