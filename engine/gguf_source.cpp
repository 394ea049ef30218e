#include "engine/gguf_source.h"

#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

// Hub suffix (after "model.layers.N.") → GGUF suffix (after "blk.N.")
struct Rename {
  const char* hub;
  const char* gguf;
};
constexpr Rename kLayer[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};

int64_t meta_int(const GgufModel& m, const std::string& key) {
  const json& v = m.require(key);
  if (!v.is_number_integer())
    throw InputError(m.path() + ": GGUF metadata '" + key + "' is not an integer");
  return v.get<int64_t>();
}

double meta_float(const GgufModel& m, const std::string& key, double def) {
  auto it = m.metadata().find(key);
  if (it == m.metadata().end()) return def;
  if (!it->is_number())
    throw InputError(m.path() + ": GGUF metadata '" + key + "' is not a number");
  return it->get<double>();
}

}  // namespace

std::optional<GgufName> gguf_name_of(const std::string& hub) {
  if (hub == "model.embed_tokens.weight") return GgufName{"token_embd.weight"};
  if (hub == "model.norm.weight") return GgufName{"output_norm.weight"};
  if (hub == "lm_head.weight") return GgufName{"output.weight"};
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::regex expert(R"(mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight)");
  std::smatch m;
  if (!std::regex_match(hub, m, layer)) return std::nullopt;
  const std::string blk = "blk." + m[1].str() + ".";
  const std::string rest = m[2].str();
  std::smatch e;
  if (std::regex_match(rest, e, expert))
    return GgufName{blk + "ffn_" + e[2].str() + "_exps.weight", std::stoll(e[1].str())};
  for (const Rename& r : kLayer)
    if (rest == r.hub) return GgufName{blk + r.gguf};
  return std::nullopt;
}

bool GgufSource::has_tensor(const std::string& name) const {
  const auto g = gguf_name_of(name);
  return g && model_.find(g->name) != nullptr;
}

SourceTensor GgufSource::find_tensor(const std::string& name) const {
  const auto g = gguf_name_of(name);
  const TensorView* t = g ? model_.find(g->name) : nullptr;
  if (!t) {
    throw InputError(model_.path() + ": tensor '" + name + "' (GGUF '" +
                     (g ? g->name : std::string("?")) + "') is missing");
  }
  if (g->expert < 0) return {t, 0, t->shape};
  // stacked experts [E, rows, cols]: expert e is rows [e·rows, (e+1)·rows) of [E·rows, cols]
  if (t->shape.size() != 3 || g->expert >= t->shape[0]) {
    throw InputError(model_.path() + ": tensor '" + g->name + "' does not hold expert " +
                     std::to_string(g->expert));
  }
  return {t, g->expert * t->shape[1], {t->shape[1], t->shape[2]}};
}

ModelConfig gguf_model_config(const GgufModel& m) {
  const json& arch_v = m.require("general.architecture");
  if (!arch_v.is_string()) throw InputError(m.path() + ": general.architecture is not a string");
  const std::string arch = arch_v.get<std::string>();
  json c;
  if (arch == "qwen3moe") {
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["norm_topk_prob"] = true;
  } else if (arch == "qwen2moe") {
    c["architectures"] = {"Qwen2MoeForCausalLM"};
    c["norm_topk_prob"] = false;
  } else if (arch == "qwen3") {
    c["architectures"] = {"Qwen3ForCausalLM"};
  } else {
    throw InputError(m.path() + ": GGUF architecture '" + arch +
                     "' is not supported (qwen3moe, qwen2moe, qwen3)");
  }
  const std::string a = arch + ".";
  const TensorView* embd = m.find("token_embd.weight");
  if (!embd || embd->shape.size() != 2)
    throw InputError(m.path() + ": token_embd.weight missing or not 2-D");
  c["vocab_size"] = embd->shape[0];
  c["hidden_size"] = meta_int(m, a + "embedding_length");
  c["num_hidden_layers"] = meta_int(m, a + "block_count");
  c["num_attention_heads"] = meta_int(m, a + "attention.head_count");
  c["num_key_value_heads"] = meta_int(m, a + "attention.head_count_kv");
  if (m.metadata().contains(a + "attention.key_length"))
    c["head_dim"] = meta_int(m, a + "attention.key_length");
  c["max_position_embeddings"] = meta_int(m, a + "context_length");
  c["rms_norm_eps"] = meta_float(m, a + "attention.layer_norm_rms_epsilon", 1e-6);
  c["rope_theta"] = meta_float(m, a + "rope.freq_base", 10000.0);
  c["intermediate_size"] =
      m.metadata().contains(a + "feed_forward_length") ? meta_int(m, a + "feed_forward_length") : 1;
  c["tie_word_embeddings"] = m.find("output.weight") == nullptr;
  if (arch != "qwen3") {
    c["num_experts"] = meta_int(m, a + "expert_count");
    c["num_experts_per_tok"] = meta_int(m, a + "expert_used_count");
    c["moe_intermediate_size"] = meta_int(m, a + "expert_feed_forward_length");
    if (arch == "qwen2moe" && m.metadata().contains(a + "expert_shared_feed_forward_length"))
      c["shared_expert_intermediate_size"] = meta_int(m, a + "expert_shared_feed_forward_length");
  }
  // Qwen2-MoE's q/k/v biases are part of the architecture
  if (arch == "qwen2moe") c["qkv_bias"] = m.find("blk.0.attn_q.bias") != nullptr;
  return parse_model_config(c, m.path() + " (GGUF metadata)");
}

}  // namespace moebatch
