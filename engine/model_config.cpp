#include "engine/model_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "common/error.h"
#include "common/json_parse.h"
#include "common/paths.h"

namespace moebatch {
namespace {

using nlohmann::json;

// config.json files are a few KB; anything this large is not a config.
constexpr std::uintmax_t kMaxConfigBytes = 4u << 20;

[[noreturn]] void fail(const std::string& source, const std::string& field,
                       const std::string& what) {
  throw InputError(source + ": field '" + field + "': " + what);
}

// Reads an integer field within [lo, hi]; `def` < lo means the field is required.
int64_t get_int(const json& j, const std::string& src, const char* key, int64_t lo, int64_t hi,
                int64_t def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def < lo) fail(src, key, "missing (required)");
    return def;
  }
  if (!it->is_number_integer()) fail(src, key, "expected an integer, got " + json_excerpt(*it));
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    fail(src, key,
         "value " + std::to_string(v) + " out of range [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
  }
  return v;
}

double get_double(const json& j, const std::string& src, const char* key, double lo, double hi,
                  double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) fail(src, key, "expected a number, got " + json_excerpt(*it));
  double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    std::ostringstream os;
    os << "value " << v << " out of range [" << lo << ", " << hi << "]";
    fail(src, key, os.str());
  }
  return v;
}

bool get_bool(const json& j, const std::string& src, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) fail(src, key, "expected a boolean, got " + json_excerpt(*it));
  return it->get<bool>();
}

ModelArch detect_arch(const json& j, const std::string& src, std::string& model_type) {
  auto mt = j.find("model_type");
  if (mt != j.end() && !mt->is_string()) fail(src, "model_type", "expected a string");
  model_type = mt != j.end() ? mt->get<std::string>() : "";
  auto arch = j.find("architectures");
  // Real files carry `architectures`; transformers-5 saves may omit it, then model_type decides.
  if (arch != j.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string()) {
      fail(src, "architectures", "expected a one-element string array, got " + json_excerpt(*arch));
    }
    std::string a = (*arch)[0].get<std::string>();
    if (a == "Qwen3MoeForCausalLM") return ModelArch::Qwen3Moe;
    if (a == "Qwen2MoeForCausalLM") return ModelArch::Qwen2Moe;
    if (a == "Qwen3ForCausalLM") return ModelArch::Qwen3Dense;
    if (a == "Qwen3NextForCausalLM") return ModelArch::Qwen3Next;
    fail(src, "architectures",
         "unsupported architecture '" + a +
             "' (supported: Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
             "Qwen3NextForCausalLM)");
  }
  if (model_type == "qwen3_moe") return ModelArch::Qwen3Moe;
  if (model_type == "qwen2_moe") return ModelArch::Qwen2Moe;
  if (model_type == "qwen3") return ModelArch::Qwen3Dense;
  if (model_type == "qwen3_next") return ModelArch::Qwen3Next;
  fail(src, "model_type",
       "unsupported model_type '" + model_type +
           "' (supported: qwen3_moe, qwen2_moe, qwen3, qwen3_next)");
}

// Rotary dims from partial_rotary_factor (top level in hub files, inside rope_parameters in
// transformers-5 saves; Qwen3-Next defaults to 0.25 as transformers does): int(head_dim · f).
void parse_rotary_dim(const json& j, const json* rp, const std::string& src, ModelConfig& c) {
  const char* key = "partial_rotary_factor";
  const double def = c.arch == ModelArch::Qwen3Next ? 0.25 : 1.0;
  const double top = get_double(j, src, key, 1e-6, 1.0, def);
  double f = top;
  if (rp && rp->contains(key)) {
    f = get_double(*rp, src, key, 1e-6, 1.0, def);
    if (j.contains(key) && f != top)
      fail(src, key, "disagrees with rope_parameters.partial_rotary_factor");
  }
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * f);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    fail(src, key,
         "head_dim x factor = " + std::to_string(c.rotary_dim) + " must be even and >= 2");
  if (c.rotary_dim != c.head_dim && c.arch != ModelArch::Qwen3Next)
    fail(src, key, "partial rotary embeddings are implemented for qwen3_next only");
}

void parse_rope(const json& j, const std::string& src, ModelConfig& c) {
  // Two spellings: top-level rope_theta (+ rope_scaling), or transformers-5 rope_parameters.
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && !rp->is_null()) {
    if (!rp->is_object()) fail(src, "rope_parameters", "expected an object");
    auto type = rp->find("rope_type");
    if (type != rp->end() && (!type->is_string() || type->get<std::string>() != "default")) {
      fail(src, "rope_parameters.rope_type",
           "unsupported rope type " + json_excerpt(*type) + " (only \"default\" is implemented)");
    }
    if (!rp->contains("rope_theta")) fail(src, "rope_parameters.rope_theta", "missing");
    c.rope_theta = get_double(*rp, src, "rope_theta", 1.0, 1e12, 0.0);
    parse_rotary_dim(j, &*rp, src, c);
    return;
  }
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    // rope_type, else the older type; a field of another type is no "default" either
    const auto type = json_string_field(*rs, "rope_type", json_string_field(*rs, "type").value_or(""));
    if (type != "default") {
      fail(src, "rope_scaling",
           "unsupported rope scaling " + json_excerpt(*rs) + " (not implemented)");
    }
  }
  c.rope_theta = get_double(j, src, "rope_theta", 1.0, 1e12, 10000.0);
  parse_rotary_dim(j, nullptr, src, c);
}

// Qwen3-Next's mixers: layer_types ("linear_attention" / "full_attention" per layer), or else
// every full_attention_interval-th layer is full attention (transformers' rule, default 4).
std::vector<MixerKind> parse_mixers(const json& j, const std::string& src, const ModelConfig& c) {
  std::vector<MixerKind> out(static_cast<size_t>(c.num_layers), MixerKind::FullAttention);
  auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_layers)
      fail(src, "layer_types", "expected an array of num_hidden_layers strings");
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (t == "linear_attention") {
        out[i] = MixerKind::LinearAttention;
      } else if (t != "full_attention") {
        fail(src, "layer_types",
             "unsupported layer type " + json_excerpt(t) + " (full_attention or linear_attention)");
      }
    }
    return out;
  }
  const int64_t every = get_int(j, src, "full_attention_interval", 1, c.num_layers, 4);
  for (int64_t i = 0; i < c.num_layers; ++i)
    if ((i + 1) % every != 0) out[static_cast<size_t>(i)] = MixerKind::LinearAttention;
  return out;
}

// Gated DeltaNet sizes; transformers' defaults where a field is absent.
void parse_linear_attention(const json& j, const std::string& src, ModelConfig& c) {
  LinearAttentionDims& a = c.linear;
  a.num_k_heads = get_int(j, src, "linear_num_key_heads", 1, 1024, 16);
  a.num_v_heads = get_int(j, src, "linear_num_value_heads", 1, 4096, 32);
  a.k_head_dim = get_int(j, src, "linear_key_head_dim", 1, 1024, 128);
  a.v_head_dim = get_int(j, src, "linear_value_head_dim", 1, 1024, 128);
  a.conv_kernel = get_int(j, src, "linear_conv_kernel_dim", 1, 64, 4);
  if (a.num_v_heads % a.num_k_heads != 0) {
    fail(src, "linear_num_value_heads",
         std::to_string(a.num_v_heads) + " is not a multiple of linear_num_key_heads " +
             std::to_string(a.num_k_heads));
  }
}

// The optional string `name` of object `obj` (at `key`): "" when absent, a failure naming it
// when it holds another type.
std::string string_field(const json& obj, const std::string& src, const std::string& key, const char* name) {
  auto v = json_string_field(obj, name);
  if (!v) fail(src, key + "." + name, "expected a string, found " + json_excerpt(obj[name]));
  return *v;
}

// ModelOpt NVFP4 ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
// "exclude_modules": [...]} in config.json, or the same under "quantization" in
// hf_quant_config.json).
void parse_nvfp4(const json& q, const std::string& src, const std::string& key, ModelConfig& c) {
  const std::string algo = string_field(q, src, key, "quant_algo");
  if (algo != "NVFP4") {
    fail(src, key + ".quant_algo",
         "unsupported ModelOpt quant_algo '" + algo + "' (only NVFP4 is implemented)");
  }
  c.quant = QuantMethod::Nvfp4;
  c.quant_group_size = q.contains("group_size") && q["group_size"].is_number_integer()
                           ? q["group_size"].get<int64_t>()
                           : 16;
  if (c.quant_group_size != 16) {
    fail(src, key + ".group_size",
         "NVFP4 scales cover 16 inputs, got " + std::to_string(c.quant_group_size));
  }
  if (auto ex = q.find("exclude_modules"); ex != q.end() && !ex->is_null()) {
    if (!ex->is_array() || ex->size() > 100000)
      fail(src, key + ".exclude_modules", "expected an array");
    for (const auto& m : *ex) {
      if (!m.is_string() || m.get<std::string>().size() > 1024)
        fail(src, key + ".exclude_modules", "entries must be module-name patterns");
      c.quant_exclude.push_back(m.get<std::string>());
    }
  }
}

void parse_quant(const json& j, const std::string& src, ModelConfig& c) {
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return;
  if (!q->is_object()) fail(src, "quantization_config", "expected an object");
  const std::string method = string_field(*q, src, "quantization_config", "quant_method");
  if (method == "modelopt") {
    parse_nvfp4(*q, src, "quantization_config", c);
    return;
  }
  if (method != "fp8") {
    fail(
        src, "quantization_config.quant_method",
        "unsupported quantization '" + method + "' (block fp8 and ModelOpt NVFP4 are implemented)");
  }
  auto bs = q->find("weight_block_size");
  if (bs == q->end() || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
      !(*bs)[1].is_number_integer()) {
    fail(src, "quantization_config.weight_block_size",
         "expected [rows, cols] integers (per-tensor fp8 is not implemented)");
  }
  c.quant = QuantMethod::Fp8Block;
  c.quant_block_rows = (*bs)[0].get<int64_t>();
  c.quant_block_cols = (*bs)[1].get<int64_t>();
  if (c.quant_block_rows < 1 || c.quant_block_rows > 4096 || c.quant_block_cols < 1 ||
      c.quant_block_cols > 4096) {
    fail(src, "quantization_config.weight_block_size", "block sizes must be in [1, 4096]");
  }
}

}  // namespace

const char* arch_name(ModelArch a) {
  switch (a) {
    case ModelArch::Qwen3Moe:
      return "qwen3_moe";
    case ModelArch::Qwen2Moe:
      return "qwen2_moe";
    case ModelArch::Qwen3Dense:
      return "qwen3";
    case ModelArch::Qwen3Next:
      return "qwen3_next";
  }
  return "?";
}

namespace {

// '*' matches any run of characters (including none and dots); everything else literally.
bool glob_match(std::string_view pat, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && pat[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pat.size() && pat[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

}  // namespace

bool quant_excluded(const ModelConfig& cfg, const std::string& module) {
  for (const std::string& pat : cfg.quant_exclude)
    if (glob_match(pat, module)) return true;
  return false;
}

int64_t ModelConfig::num_kv_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const LayerKind& k) { return k.has_kv(); });
}

std::vector<LayerKind> default_layer_kinds(const ModelConfig& c) {
  std::vector<LayerKind> out(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool forced_dense =
        std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), i) != c.mlp_only_layers.end();
    const bool moe = c.num_experts > 0 && !forced_dense && (i + 1) % c.decoder_sparse_step == 0;
    if (moe) out[i].mlp = c.has_shared_expert() ? MlpKind::MoeShared : MlpKind::Moe;
  }
  return out;
}

ModelConfig parse_model_config(const json& j, const std::string& src) {
  if (!j.is_object()) throw InputError(src + ": expected a JSON object at top level");
  ModelConfig c;
  c.arch = detect_arch(j, src, c.model_type);
  c.vocab_size = get_int(j, src, "vocab_size", 1, 1 << 22, -1);
  c.hidden_size = get_int(j, src, "hidden_size", 1, 1 << 16, -1);
  c.num_layers = get_int(j, src, "num_hidden_layers", 1, 1024, -1);
  c.num_heads = get_int(j, src, "num_attention_heads", 1, 1024, -1);
  c.num_kv_heads = get_int(j, src, "num_key_value_heads", 1, 1024, c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    fail(src, "num_key_value_heads",
         std::to_string(c.num_kv_heads) + " does not divide num_attention_heads " +
             std::to_string(c.num_heads));
  }
  int64_t def_hd = c.hidden_size % c.num_heads == 0 ? c.hidden_size / c.num_heads : -1;
  if (c.arch == ModelArch::Qwen3Next) def_hd = 256;  // transformers' Qwen3NextConfig default
  c.head_dim = get_int(j, src, "head_dim", 2, 1024, def_hd);
  if (c.head_dim % 2 != 0) fail(src, "head_dim", "must be even for rotary embeddings");
  c.rms_norm_eps = get_double(j, src, "rms_norm_eps", 1e-12, 1.0, 1e-6);
  c.max_position_embeddings = get_int(j, src, "max_position_embeddings", 1, 1 << 24, 32768);
  c.tie_word_embeddings = get_bool(j, src, "tie_word_embeddings", false);

  auto act = j.find("hidden_act");
  if (act != j.end() && (!act->is_string() || act->get<std::string>() != "silu")) {
    fail(src, "hidden_act", "unsupported activation " + json_excerpt(*act) + " (only silu)");
  }
  if (get_bool(j, src, "use_sliding_window", false)) {
    fail(src, "use_sliding_window", "sliding-window attention is not implemented");
  }
  // Only qwen3_next mixes layer types (parse_mixers); elsewhere every layer is full attention.
  auto lt = j.find("layer_types");
  if (c.arch != ModelArch::Qwen3Next && lt != j.end() && !lt->is_null()) {
    if (!lt->is_array()) fail(src, "layer_types", "expected an array");
    for (const auto& t : *lt) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        fail(src, "layer_types",
             "unsupported layer type " + json_excerpt(t) + " (only full_attention)");
      }
    }
  }
  parse_rope(j, src, c);
  parse_quant(j, src, c);

  c.intermediate_size = get_int(j, src, "intermediate_size", 1, 1 << 20, -1);
  if (c.arch == ModelArch::Qwen3Dense) {
    c.qkv_bias = get_bool(j, src, "attention_bias", false);
    c.qk_norm = true;
    c.layers = default_layer_kinds(c);
    return c;
  }
  // MoE families. Hub files say num_experts, transformers-5 saves num_local_experts.
  const char* ekey = j.contains("num_experts") ? "num_experts" : "num_local_experts";
  c.num_experts = get_int(j, src, ekey, 1, 4096, -1);
  c.num_experts_per_tok = get_int(j, src, "num_experts_per_tok", 1, c.num_experts, -1);
  c.moe_intermediate_size = get_int(j, src, "moe_intermediate_size", 1, 1 << 20, -1);
  c.norm_topk_prob = get_bool(j, src, "norm_topk_prob",
                              c.arch == ModelArch::Qwen3Moe || c.arch == ModelArch::Qwen3Next);
  c.decoder_sparse_step = get_int(j, src, "decoder_sparse_step", 1, c.num_layers, 1);
  if (auto m = j.find("mlp_only_layers"); m != j.end() && !m->is_null()) {
    if (!m->is_array()) fail(src, "mlp_only_layers", "expected an array of layer indices");
    for (const auto& v : *m) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.num_layers) {
        fail(src, "mlp_only_layers", "entry " + json_excerpt(v) + " is not a layer index");
      }
      c.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (c.arch == ModelArch::Qwen2Moe) {
    // Qwen2-MoE always has q/k/v bias (older configs do not spell it) and no q/k norm.
    c.qkv_bias = get_bool(j, src, "qkv_bias", true);
    c.shared_expert_intermediate_size =
        get_int(j, src, "shared_expert_intermediate_size", 0, 1 << 20, 0);
  } else {
    c.qkv_bias = get_bool(j, src, "attention_bias", false);
    c.qk_norm = true;
  }
  if (c.arch != ModelArch::Qwen3Next) {
    c.layers = default_layer_kinds(c);
  } else {
    // Hybrid: Gated DeltaNet + gated full attention, zero-centred norms, shared expert
    // (transformers' default width 512 when unspelt).
    if (c.qkv_bias)
      fail(src, "attention_bias", "attention biases are not implemented for qwen3_next");
    c.attn_output_gate = true;
    c.zero_centred_norm = true;
    c.shared_expert_intermediate_size =
        get_int(j, src, "shared_expert_intermediate_size", 0, 1 << 20, 512);
    parse_linear_attention(j, src, c);
    const std::vector<MixerKind> mixers = parse_mixers(j, src, c);
    c.layers = default_layer_kinds(c);
    for (size_t i = 0; i < mixers.size(); ++i) c.layers[i].mixer = mixers[i];
  }
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  std::string problem;
  json j = parse_json_bounded(read_file_limited(path, kMaxConfigBytes), &problem);
  if (!problem.empty()) throw InputError(path.string() + ": " + problem);
  ModelConfig c = parse_model_config(j, path.string());
  // ModelOpt may state its quantization only in hf_quant_config.json.
  const auto hq = dir / "hf_quant_config.json";
  if (c.quant == QuantMethod::None && std::filesystem::exists(hq)) {
    json qj = parse_json_bounded(read_file_limited(hq, kMaxConfigBytes));
    if (qj.is_discarded() || !qj.is_object() || !qj.contains("quantization") ||
        !qj["quantization"].is_object())
      throw InputError(hq.string() + ": expected {\"quantization\": {...}}");
    parse_nvfp4(qj["quantization"], hq.string(), "quantization", c);
  }
  return c;
}

}  // namespace moebatch
