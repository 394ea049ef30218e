// Model hyper-parameters parsed from a Hugging Face config.json (qwen3_moe, qwen2_moe, qwen3,
// qwen3_next).
// Parsing validates every field we use against bounds and rejects features the engine does not
// implement (sliding window, rope scaling, unknown quantization) with an error naming the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace moebatch {

/// Which family of decoder the checkpoint is; decides hub tensor names and small semantics.
enum class ModelArch { Qwen3Moe, Qwen2Moe, Qwen3Dense, Qwen3Next };

/// Weight quantization of the checkpoint.
enum class QuantMethod {
  None,
  Fp8Block,  ///< F8_E4M3 weights, weight_scale_inv per [block_rows, block_cols] (Qwen/DeepSeek)
  Nvfp4,     ///< ModelOpt NVFP4: packed E2M1 pairs, F8_E4M3 scale per 16 inputs, F32 scale_2
};

/// The token mixer of one decoder layer.
enum class MixerKind {
  FullAttention,    ///< softmax attention over the paged KV cache
  LinearAttention,  ///< Gated DeltaNet (Qwen3-Next): per-sequence recurrent state, no KV
};

/// The feed-forward block of one decoder layer.
enum class MlpKind {
  Dense,      ///< SwiGLU MLP of intermediate_size
  Moe,        ///< routed experts
  MoeShared,  ///< routed experts + a shared expert behind a sigmoid gate (Qwen2-MoE)
};

/// What one decoder layer is made of; the forwards dispatch on it per layer.
struct LayerKind {
  MixerKind mixer = MixerKind::FullAttention;  ///< token mixer
  MlpKind mlp = MlpKind::Dense;                ///< feed-forward block
  bool has_kv() const { return mixer == MixerKind::FullAttention; }
  bool is_moe() const { return mlp != MlpKind::Dense; }
};

/// Sizes of the Gated DeltaNet linear-attention layers (Qwen3-Next's `linear_*` fields).
struct LinearAttentionDims {
  int64_t num_k_heads = 0;  ///< linear_num_key_heads (q and k heads)
  int64_t num_v_heads = 0;  ///< linear_num_value_heads, a multiple of num_k_heads
  int64_t k_head_dim = 0;   ///< linear_key_head_dim
  int64_t v_head_dim = 0;   ///< linear_value_head_dim
  int64_t conv_kernel = 0;  ///< linear_conv_kernel_dim (causal depthwise conv width)
  /// Channels of the causal conv: q (nk·dk), k (nk·dk), v (nv·dv).
  int64_t conv_dim() const { return 2 * num_k_heads * k_head_dim + num_v_heads * v_head_dim; }
  /// fp32 values of one sequence's state in one layer: conv [conv_dim, kernel-1] (the last
  /// kernel-1 conv inputs) + delta rule [nv, dk, dv].
  int64_t state_floats() const {
    return conv_dim() * (conv_kernel - 1) + num_v_heads * k_head_dim * v_head_dim;
  }
};

/// Validated model hyper-parameters. All sizes are positive and consistent once constructed.
struct ModelConfig {
  ModelArch arch = ModelArch::Qwen3Moe;         ///< family, from architectures or model_type
  std::string model_type;                       ///< the raw model_type string
  int64_t vocab_size = 0;                       ///< rows of embed_tokens / lm_head
  int64_t hidden_size = 0;                      ///< H
  int64_t num_layers = 0;                       ///< decoder layers
  int64_t num_heads = 0;                        ///< query heads
  int64_t num_kv_heads = 0;                     ///< key/value heads (GQA when < num_heads)
  int64_t head_dim = 0;                         ///< per-head width (may differ from H/heads)
  int64_t intermediate_size = 0;                ///< dense MLP width (dense layers)
  int64_t moe_intermediate_size = 0;            ///< per-expert width I
  int64_t num_experts = 0;                      ///< E (0 for dense models)
  int64_t num_experts_per_tok = 0;              ///< top-k
  bool norm_topk_prob = false;                  ///< renormalize top-k router weights
  int64_t shared_expert_intermediate_size = 0;  ///< 0 when there is no shared expert
  int64_t decoder_sparse_step = 1;              ///< MoE every n-th layer
  std::vector<int64_t> mlp_only_layers;         ///< layers forced dense inside a MoE model
  bool qkv_bias = false;                        ///< q/k/v projections carry a bias
  bool qk_norm = false;                         ///< per-head RMSNorm on q and k (Qwen3)
  bool tie_word_embeddings = false;             ///< lm_head shares embed_tokens
  double rms_norm_eps = 1e-6;                   ///< RMSNorm epsilon
  double rope_theta = 10000.0;                  ///< RoPE base
  int64_t max_position_embeddings = 0;          ///< longest position the model supports
  QuantMethod quant = QuantMethod::None;        ///< checkpoint weight quantization
  int64_t quant_block_rows = 0;                 ///< FP8 block size along out (rows)
  int64_t quant_block_cols = 0;                 ///< FP8 block size along in (cols)
  int64_t quant_group_size = 0;                 ///< NVFP4: inputs per scale (16)
  std::vector<std::string> quant_exclude;       ///< NVFP4: modules left unquantized (wildcards)
  std::vector<LayerKind> layers;                ///< [num_layers], decided once at parse time
  // Qwen3-Next variants (rotary_dim is set for every family)
  int64_t rotary_dim = 0;          ///< leading dims of a head that RoPE rotates (head_dim: all)
  bool attn_output_gate = false;   ///< q_proj yields [query | gate] per head; out ·= sigmoid(gate)
  bool zero_centred_norm = false;  ///< RMSNorm weights are applied as (1 + w)
  LinearAttentionDims linear;      ///< Gated DeltaNet sizes (linear-attention layers only)

  /// True when layer `i` uses routed experts (else a dense SwiGLU MLP).
  bool is_moe_layer(int64_t i) const { return layers[static_cast<size_t>(i)].is_moe(); }
  /// Layers that keep a paged KV cache (full attention).
  int64_t num_kv_layers() const;
  /// Layers with linear attention (recurrent state instead of KV).
  int64_t num_linear_layers() const { return num_layers - num_kv_layers(); }
  /// Bytes of one sequence's recurrent state over all layers and ranks, held in fp32
  /// (0: no linear-attention layers).
  int64_t state_bytes_per_seq() const {
    return num_linear_layers() * linear.state_floats() * static_cast<int64_t>(sizeof(float));
  }
  /// True when the model has a shared expert with a sigmoid gate (Qwen2-MoE).
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
};

/// The per-layer kinds of the qwen3_moe / qwen2_moe / qwen3 families: full attention everywhere;
/// MoE on every decoder_sparse_step-th layer except mlp_only_layers (dense models: all dense).
/// (qwen3_next sets the mixers from layer_types on top of this.)
/// Code that builds a ModelConfig by hand (benchmarks, tests) sets `layers` with this.
std::vector<LayerKind> default_layer_kinds(const ModelConfig& c);

/// Parses and validates a config.json document; `source` names it in error messages.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

/// Reads `dir/config.json` (size-capped) and parses it. Throws InputError naming file and field.
ModelConfig load_model_config(const std::filesystem::path& dir);

/// True when module `name` (a hub name without ".weight") is excluded from quantization by
/// `cfg.quant_exclude` ('*' matches any run of characters, as ModelOpt's patterns).
bool quant_excluded(const ModelConfig& cfg, const std::string& module);

/// Human name of an architecture ("qwen3_moe", ...).
const char* arch_name(ModelArch a);

}  // namespace moebatch
