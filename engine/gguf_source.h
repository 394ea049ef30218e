// A GGUF model as the loader sees it: the config from its metadata, and its tensors under the
// Hugging Face hub names the weight plans use (`blk.N.attn_q.weight` is
// `model.layers.N.self_attn.q_proj.weight`; the experts' stacked `ffn_gate_exps` [E, I, H] serve
// `model.layers.N.mlp.experts.E.gate_proj.weight` as a row block).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "engine/gguf.h"
#include "engine/model_config.h"
#include "engine/weight_source.h"

namespace moebatch {

/// The ModelConfig of a GGUF model (architectures qwen3moe, qwen2moe, qwen3), built from its
/// metadata and validated like a config.json. InputError naming the key otherwise.
ModelConfig gguf_model_config(const GgufModel& model);

/// Hub-named tensors of a GGUF model.
class GgufSource final : public WeightSource {
 public:
  explicit GgufSource(const std::filesystem::path& path) : model_(path) {}
  const std::string& source_name() const override { return model_.path(); }
  bool has_tensor(const std::string& name) const override;
  SourceTensor find_tensor(const std::string& name) const override;
  /// The underlying model (metadata, tokenizer keys).
  const GgufModel& model() const { return model_; }

 private:
  GgufModel model_;
};

/// A hub tensor name's GGUF name and, for a stacked expert, its expert index.
struct GgufName {
  std::string name;     ///< e.g. "blk.3.ffn_gate_exps.weight"
  int64_t expert = -1;  ///< index into the stacked tensor, or -1
};
/// The GGUF name of hub tensor `hub`, or nullopt when GGUF has no such tensor.
std::optional<GgufName> gguf_name_of(const std::string& hub);

}  // namespace moebatch
