// Where the loader finds hub-named tensors. A weight plan (engine/weights.h) names every tensor
// as the Hugging Face hub does ("model.layers.3.mlp.experts.5.gate_proj.weight"); a source maps
// those names onto what its file holds. Safetensors checkpoints hold hub names as they are
// (Checkpoint); GGUF files hold `blk.N.*` names with experts pre-stacked, so a source can answer
// with a row block of a larger file tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moebatch {

struct TensorView;

/// A hub tensor inside a file tensor: rows [row0, row0 + shape[0]) of `view`, whose elements
/// are read as a row-major [rows, shape[1]] matrix (1-D tensors as [n, 1]).
struct SourceTensor {
  const TensorView* view = nullptr;  ///< the file tensor
  int64_t row0 = 0;                  ///< first row of the hub tensor inside it
  std::vector<int64_t> shape;        ///< the hub tensor's shape
};

/// A read-only set of tensors addressed by hub name.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// What the source is (a path), for messages.
  virtual const std::string& source_name() const = 0;
  /// True when the source holds hub tensor `name`.
  virtual bool has_tensor(const std::string& name) const = 0;
  /// Hub tensor `name`, or InputError naming the source and tensor.
  virtual SourceTensor find_tensor(const std::string& name) const = 0;
};

}  // namespace moebatch
