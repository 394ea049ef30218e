// Opening a model on disk, whatever its format: a Hugging Face directory (config.json +
// safetensors) or a GGUF file (split parts included). The result is the validated config and a
// WeightSource that serves hub-named tensors to the weight plans, so every backend loads both
// formats through the same code.
#pragma once

#include <filesystem>
#include <memory>

#include "engine/model_config.h"
#include "engine/weight_source.h"

namespace moebatch {

/// A model's config and its tensors.
struct ModelFiles {
  ModelConfig config;                    ///< validated hyper-parameters
  std::unique_ptr<WeightSource> weights; ///< hub-named tensors (the files stay mapped)
};

/// Opens `path`: a directory with config.json, or a .gguf file. InputError on anything wrong.
ModelFiles open_model_files(const std::filesystem::path& path);

/// Only the config of the model at `path` (reads no tensor data).
ModelConfig load_any_model_config(const std::filesystem::path& path);

}  // namespace moebatch
