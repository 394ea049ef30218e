#include "engine/model_files.h"

#include "common/error.h"
#include "engine/gguf_source.h"
#include "engine/safetensors.h"

namespace moebatch {

ModelFiles open_model_files(const std::filesystem::path& path) {
  ModelFiles out;
  if (is_gguf_path(path)) {
    auto src = std::make_unique<GgufSource>(path);
    out.config = gguf_model_config(src->model());
    out.weights = std::move(src);
    return out;
  }
  out.config = load_model_config(path);  // config errors before any tensor file is opened
  out.weights = std::make_unique<Checkpoint>(path);
  return out;
}

ModelConfig load_any_model_config(const std::filesystem::path& path) {
  if (is_gguf_path(path)) return gguf_model_config(GgufModel(path));
  return load_model_config(path);
}

}  // namespace moebatch
