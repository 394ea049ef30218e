#include "engine/model_shapes.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

// Qwen3-30B-A3B's published config.json (the fields the engine reads).
json qwen3_30b_a3b() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", 151936},
          {"hidden_size", 2048},
          {"num_hidden_layers", 48},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 4},
          {"head_dim", 128},
          {"intermediate_size", 6144},
          {"moe_intermediate_size", 768},
          {"num_experts", 128},
          {"num_experts_per_tok", 8},
          {"norm_topk_prob", true},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"max_position_embeddings", 40960},
          {"tie_word_embeddings", false}};
}

// The seeds' 125B-A6B class as a qwen3_moe shape (docs/performance.md): 119 B parameters,
// 6.0 B active per token.
json flash_next_125b_a6b() {
  json j = qwen3_30b_a3b();
  j["hidden_size"] = 4096;
  j["num_experts"] = 256;
  j["intermediate_size"] = 12288;
  return j;
}

// Qwen3-Next-80B-A3B's published config.json: 48 layers, every 4th full attention (16 q / 2 kv
// heads of 256, a quarter of each rotated, output gate), the rest Gated DeltaNet (16 key heads /
// 32 value heads of 128, conv 4); 512 experts top-10 of width 512 and a gated shared expert.
json qwen3_next_80b_a3b() {
  return {{"architectures", {"Qwen3NextForCausalLM"}},
          {"model_type", "qwen3_next"},
          {"vocab_size", 151936},
          {"hidden_size", 2048},
          {"num_hidden_layers", 48},
          {"full_attention_interval", 4},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 2},
          {"head_dim", 256},
          {"partial_rotary_factor", 0.25},
          {"linear_num_key_heads", 16},
          {"linear_num_value_heads", 32},
          {"linear_key_head_dim", 128},
          {"linear_value_head_dim", 128},
          {"linear_conv_kernel_dim", 4},
          {"intermediate_size", 5120},
          {"moe_intermediate_size", 512},
          {"shared_expert_intermediate_size", 512},
          {"num_experts", 512},
          {"num_experts_per_tok", 10},
          {"decoder_sparse_step", 1},
          {"norm_topk_prob", true},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000000.0},
          {"max_position_embeddings", 262144},
          {"tie_word_embeddings", false}};
}

// A small MoE for quick device runs; the real Qwen3 vocabulary, so the bundled tokenizer serves it.
json tiny_moe() {
  json j = qwen3_30b_a3b();
  j["hidden_size"] = 256;
  j["num_hidden_layers"] = 4;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 64;
  j["intermediate_size"] = 512;
  j["moe_intermediate_size"] = 128;
  j["num_experts"] = 16;
  j["num_experts_per_tok"] = 4;
  return j;
}

struct Shape {
  const char* name;
  json (*config)();
};

const Shape kShapes[] = {
    {"qwen3-30b-a3b", qwen3_30b_a3b},
    {"flash-next-125b-a6b", flash_next_125b_a6b},
    {"qwen3-next-80b-a3b", qwen3_next_80b_a3b},
    {"tiny-moe", tiny_moe},
};

}  // namespace

ModelConfig named_model_shape(const std::string& name) {
  for (const Shape& s : kShapes) {
    if (name == s.name) return parse_model_config(s.config(), std::string("shape ") + s.name);
  }
  std::string known;
  for (const Shape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  throw InputError("unknown model shape '" + name + "' (known: " + known + ")");
}

std::vector<std::string> model_shape_names() {
  std::vector<std::string> out;
  for (const Shape& s : kShapes) out.emplace_back(s.name);
  return out;
}

}  // namespace moebatch
