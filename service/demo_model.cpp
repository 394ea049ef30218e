#include "service/demo_model.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/safetensors.h"
#include "engine/tokenizer/tokenizer.h"

namespace moebatch {
namespace {

using nlohmann::json;

// splitmix64: a portable generator (std distributions differ between standard libraries, and
// the demo model must be the same everywhere for a given seed).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-scale, scale).
  float uniform(float scale) {
    return scale * (static_cast<float>(next() >> 40) / static_cast<float>(1 << 23) - 1.0f);
  }
};

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

Tensor random_tensor(SplitMix& rng, std::string name, std::vector<int64_t> shape, float scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor t{std::move(name), std::move(shape), std::vector<float>(static_cast<size_t>(n))};
  for (float& v : t.data) v = rng.uniform(scale);
  return t;
}

Tensor ones(std::string name, int64_t n) {
  return Tensor{std::move(name), {n}, std::vector<float>(static_cast<size_t>(n), 1.0f)};
}

Tensor zeros(std::string name, int64_t n) {
  return Tensor{std::move(name), {n}, std::vector<float>(static_cast<size_t>(n), 0.0f)};
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  if (!out) throw Error("cannot write " + p.string());
}

/// A generated checkpoint: config.json and the tensors of model.safetensors.
struct DemoCheckpoint {
  json config;
  std::vector<Tensor> tensors;
};

constexpr int64_t kHeads = 4, kKvHeads = 2;  // attention heads of both architectures

// config.json fields both architectures share (kHeads q / kKvHeads kv heads of `hd`; experts of width
// hidden, dense width 2·hidden). json objects keep their keys sorted, so the bytes do not depend
// on where a field is set.
json shared_config(const DemoModelSpec& spec, int64_t vocab, int64_t hd) {
  return {{"vocab_size", vocab},
          {"hidden_size", spec.hidden},
          {"intermediate_size", 2 * spec.hidden},
          {"moe_intermediate_size", spec.hidden},
          {"num_hidden_layers", spec.layers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"head_dim", hd},
          {"num_experts", spec.experts},
          {"num_experts_per_tok", spec.top_k},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-6},
          {"attention_bias", false},
          {"torch_dtype", "float32"},
          {"moebatch_note", "RANDOM WEIGHTS: a demo model; its text is gibberish"}};
}

// The router and the routed experts of one layer under `mlp` ("model.layers.N.mlp."), each
// matrix made by make(name, rows, cols) in this order (the order fixes the random bytes).
template <class Make>
void add_routed_experts(std::vector<Tensor>& ts, const std::string& mlp, const DemoModelSpec& spec,
                        Make&& make) {
  const int64_t H = spec.hidden, I = spec.hidden;
  ts.push_back(make(mlp + "gate.weight", spec.experts, H));
  for (int64_t e = 0; e < spec.experts; ++e) {
    const std::string ep = mlp + "experts." + std::to_string(e) + ".";
    ts.push_back(make(ep + "gate_proj.weight", I, H));
    ts.push_back(make(ep + "up_proj.weight", I, H));
    ts.push_back(make(ep + "down_proj.weight", H, I));
  }
}

// The qwen3_moe demo, unchanged since v1: a given seed keeps giving the same bytes (and text).
DemoCheckpoint qwen3_moe_checkpoint(const DemoModelSpec& spec, int64_t vocab) {
  const int64_t H = spec.hidden, heads = kHeads, kv_heads = kKvHeads, hd = 16;
  DemoCheckpoint ck;
  ck.config = shared_config(spec, vocab, hd);
  ck.config["architectures"] = json::array({"Qwen3MoeForCausalLM"});
  ck.config["model_type"] = "qwen3_moe";
  ck.config["rope_theta"] = 1000000.0;
  ck.config["tie_word_embeddings"] = true;

  SplitMix rng{spec.seed};
  std::vector<Tensor>& ts = ck.tensors;
  // Embeddings large enough that logits are not flat: sampling then picks varied ids.
  ts.push_back(random_tensor(rng, "model.embed_tokens.weight", {vocab, H}, 0.5f));
  ts.push_back(ones("model.norm.weight", H));
  const float w = 1.0f / static_cast<float>(H);
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(ones(p + "input_layernorm.weight", H));
    ts.push_back(ones(p + "post_attention_layernorm.weight", H));
    ts.push_back(random_tensor(rng, p + "self_attn.q_proj.weight", {heads * hd, H}, w));
    ts.push_back(random_tensor(rng, p + "self_attn.k_proj.weight", {kv_heads * hd, H}, w));
    ts.push_back(random_tensor(rng, p + "self_attn.v_proj.weight", {kv_heads * hd, H}, w));
    ts.push_back(random_tensor(rng, p + "self_attn.o_proj.weight", {H, heads * hd}, w));
    ts.push_back(ones(p + "self_attn.q_norm.weight", hd));
    ts.push_back(ones(p + "self_attn.k_norm.weight", hd));
    add_routed_experts(ts, p + "mlp.", spec, [&](std::string name, int64_t rows, int64_t cols) {
      return random_tensor(rng, std::move(name), {rows, cols}, w);
    });
  }
  return ck;
}

// Qwen3-Next in miniature, in the hub layout engine/weights.cpp plans: every 4th layer full
// attention (the published ratio) with the output gate in q_proj ([query | gate] rows per head)
// and a quarter of each head rotated; the others Gated DeltaNet, sized within what the CUDA
// kernels take (key head dim 32, value head dim a multiple of 32, conv kernel 2..8); routed
// experts plus a gated shared expert; zero-centred norms; an lm_head of its own, as in the
// published checkpoints.
DemoCheckpoint qwen3_next_checkpoint(const DemoModelSpec& spec, int64_t vocab) {
  const int64_t H = spec.hidden, heads = kHeads, kv_heads = kKvHeads, hd = 32;
  const int64_t shared_I = 2 * spec.hidden;
  const int64_t nk = 2, nv = 4, dk = 32, dv = 32, conv_k = 4;
  const int64_t r = nv / nk, grp = 2 * dk + 2 * r * dv;  // in_proj_qkvz rows per key head
  const int64_t conv_ch = 2 * nk * dk + nv * dv;         // conv channels: q, k, v
  json layer_types = json::array();
  for (int64_t l = 0; l < spec.layers; ++l)
    layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  DemoCheckpoint ck;
  ck.config = shared_config(spec, vocab, hd);
  ck.config.update(json{{"architectures", {"Qwen3NextForCausalLM"}},
                        {"model_type", "qwen3_next"},
                        {"shared_expert_intermediate_size", shared_I},
                        {"layer_types", layer_types},
                        {"partial_rotary_factor", 0.25},
                        {"linear_num_key_heads", nk},
                        {"linear_num_value_heads", nv},
                        {"linear_key_head_dim", dk},
                        {"linear_value_head_dim", dv},
                        {"linear_conv_kernel_dim", conv_k},
                        {"rope_theta", 10000000.0},
                        {"tie_word_embeddings", false}});

  SplitMix rng{spec.seed};
  std::vector<Tensor>& ts = ck.tensors;
  // Projections uniform in ±1/sqrt(fan_in): each keeps its input's scale within a small factor,
  // so every layer (and the recurrent state) moves the logits rather than vanishing under the
  // embedding in the residual stream.
  const auto proj = [&rng](std::string name, int64_t rows, int64_t cols) {
    return random_tensor(rng, std::move(name), {rows, cols},
                         1.0f / std::sqrt(static_cast<float>(cols)));
  };
  ts.push_back(random_tensor(rng, "model.embed_tokens.weight", {vocab, H}, 0.5f));
  ts.push_back(random_tensor(rng, "lm_head.weight", {vocab, H}, 0.5f));
  // Zero-centred RMSNorm weights act as (1 + w): zeros are the unit scale, and what
  // transformers initialises them to.
  ts.push_back(zeros("model.norm.weight", H));
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(zeros(p + "input_layernorm.weight", H));
    ts.push_back(zeros(p + "post_attention_layernorm.weight", H));
    if ((l + 1) % 4 == 0) {
      const std::string a = p + "self_attn.";
      ts.push_back(proj(a + "q_proj.weight", 2 * heads * hd, H));
      ts.push_back(proj(a + "k_proj.weight", kv_heads * hd, H));
      ts.push_back(proj(a + "v_proj.weight", kv_heads * hd, H));
      ts.push_back(proj(a + "o_proj.weight", H, heads * hd));
      ts.push_back(zeros(a + "q_norm.weight", hd));
      ts.push_back(zeros(a + "k_norm.weight", hd));
    } else {
      const std::string a = p + "linear_attn.";
      ts.push_back(proj(a + "in_proj_qkvz.weight", nk * grp, H));
      ts.push_back(proj(a + "in_proj_ba.weight", 2 * nv, H));
      ts.push_back(random_tensor(rng, a + "conv1d.weight", {conv_ch, 1, conv_k},
                                 1.0f / std::sqrt(static_cast<float>(conv_k))));
      // The per-token decay exp(-exp(A_log) · softplus(a + dt_bias)) lies in (0, 1); A in
      // [1, 16) spreads the heads from slow to fast forgetting. The log is taken in double and
      // rounded once, so every libm gives the same float.
      Tensor a_log{a + "A_log", {nv}, std::vector<float>(static_cast<size_t>(nv))};
      for (float& v : a_log.data) {
        const double u = static_cast<double>(rng.uniform(0.5f)) + 0.5;  // [0, 1)
        v = static_cast<float>(std::log(1.0 + 15.0 * u));
      }
      ts.push_back(std::move(a_log));
      ts.push_back(random_tensor(rng, a + "dt_bias", {nv}, 0.1f));
      // The gated output norm's weight is plain (not zero-centred).
      ts.push_back(ones(a + "norm.weight", dv));
      ts.push_back(proj(a + "out_proj.weight", H, nv * dv));
    }
    const std::string m = p + "mlp.";
    add_routed_experts(ts, m, spec, proj);
    ts.push_back(proj(m + "shared_expert.gate_proj.weight", shared_I, H));
    ts.push_back(proj(m + "shared_expert.up_proj.weight", shared_I, H));
    ts.push_back(proj(m + "shared_expert.down_proj.weight", H, shared_I));
    ts.push_back(proj(m + "shared_expert_gate.weight", 1, H));
  }
  return ck;
}

// Names carry everything that changes the bytes. The qwen3_moe name predates top_k in it and
// keeps its v1 spelling at the default top_k, so existing caches stay valid.
std::string dir_name(const DemoModelSpec& s, int64_t vocab) {
  const bool next = s.arch == DemoArch::Qwen3Next;
  std::string name = std::string(next ? "demo-qwen3next" : "demo-qwen3moe") + "-v1-h" +
                     std::to_string(s.hidden) + "-l" + std::to_string(s.layers) + "-e" +
                     std::to_string(s.experts);
  if (next || s.top_k != 2) name += "-k" + std::to_string(s.top_k);
  return name + "-v" + std::to_string(vocab) + "-s" + std::to_string(s.seed);
}

}  // namespace

std::filesystem::path default_cache_dir() {
  if (const char* c = std::getenv("MOEBATCH_CACHE"); c && *c) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::filesystem::path(x) / "moebatch";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::filesystem::path(h) / ".cache" / "moebatch";
  return std::filesystem::temp_directory_path() / "moebatch-cache";
}

std::filesystem::path find_bundled_tokenizer() {
  const char* rel = "tests/data/qwen3-tokenizer";
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / rel / "tokenizer.json")) return dir / rel;
    }
  }
  if (std::filesystem::exists(std::filesystem::path(rel) / "tokenizer.json")) return rel;
  throw InputError(std::string("cannot find the bundled tokenizer ") + rel +
                   " (run from the repository root)");
}

const char* demo_arch_name(DemoArch a) {
  switch (a) {
    case DemoArch::Qwen3Moe:
      return "qwen3_moe";
    case DemoArch::Qwen3Next:
      return "qwen3_next";
  }
  return "?";
}

DemoArch parse_demo_arch(std::string_view name) {
  for (DemoArch a : {DemoArch::Qwen3Moe, DemoArch::Qwen3Next})
    if (name == demo_arch_name(a)) return a;
  throw InputError("demo model architecture '" + std::string(name) +
                   "': expected qwen3_moe or qwen3_next");
}

DemoModelSpec demo_model_spec_from_env() {
  DemoModelSpec spec;
  if (const char* a = std::getenv("MOEBATCH_DEMO_ARCH"); a && *a) spec.arch = parse_demo_arch(a);
  return spec;
}

std::filesystem::path ensure_demo_model(const std::filesystem::path& cache_dir,
                                        const std::filesystem::path& tokenizer_dir,
                                        const DemoModelSpec& requested) {
  const bool next = requested.arch == DemoArch::Qwen3Next;
  DemoModelSpec spec = requested;
  if (spec.layers == 0) spec.layers = next ? 4 : 2;
  MB_CHECK(spec.hidden >= 8 && spec.hidden <= 1024 && spec.layers >= 1 && spec.layers <= 16 &&
               spec.experts >= 1 && spec.experts <= 64 && spec.top_k >= 1 &&
               spec.top_k <= spec.experts,
           "demo model spec out of range");
  // Full attention is every 4th layer: fewer layers would leave the model without a KV cache.
  MB_CHECK(!next || spec.layers >= 4, "demo model spec: qwen3_next needs at least 4 layers");
  const Tokenizer tok = Tokenizer::from_dir(tokenizer_dir);
  const auto vocab = static_cast<int64_t>(tok.vocab_size());
  const std::filesystem::path dir = cache_dir / dir_name(spec, vocab);
  if (std::filesystem::exists(dir / "model.safetensors")) return dir;

  std::filesystem::create_directories(cache_dir);
  const std::filesystem::path tmp =
      cache_dir / (dir.filename().string() + ".tmp-" + std::to_string(getpid()));
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  spdlog::info("generating the {} demo model (random weights, seed {}) in {}",
               demo_arch_name(spec.arch), spec.seed, dir.string());

  const DemoCheckpoint ck =
      next ? qwen3_next_checkpoint(spec, vocab) : qwen3_moe_checkpoint(spec, vocab);
  write_text(tmp / "config.json", ck.config.dump(2) + "\n");
  std::vector<OutTensor> out;
  for (const Tensor& t : ck.tensors)
    out.push_back({t.name, t.shape, DType::F32, std::as_bytes(std::span(t.data))});
  write_safetensors(tmp / "model.safetensors", out);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (std::filesystem::exists(tokenizer_dir / f))
      std::filesystem::copy_file(tokenizer_dir / f, tmp / f);
  }
  write_text(tmp / "README.txt", std::string("moebatch demo model: ") + demo_arch_name(spec.arch) +
                                     " architecture with RANDOM weights (seed " +
                                     std::to_string(spec.seed) +
                                     "). It exercises the pipeline; the text it generates is "
                                     "gibberish.\n");
  // Another process may have finished first: keep theirs (identical by construction).
  std::error_code ec;
  std::filesystem::rename(tmp, dir, ec);
  if (ec) std::filesystem::remove_all(tmp);
  if (!std::filesystem::exists(dir / "model.safetensors"))
    throw Error("demo model: could not place " + dir.string() + ": " + ec.message());
  return dir;
}

}  // namespace moebatch
