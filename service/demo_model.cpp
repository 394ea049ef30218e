#include "service/demo_model.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

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

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  if (!out) throw Error("cannot write " + p.string());
}

std::string dir_name(const DemoModelSpec& s, int64_t vocab) {
  return "demo-qwen3moe-v1-h" + std::to_string(s.hidden) + "-l" + std::to_string(s.layers) + "-e" +
         std::to_string(s.experts) + "-v" + std::to_string(vocab) + "-s" + std::to_string(s.seed);
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

std::filesystem::path ensure_demo_model(const std::filesystem::path& cache_dir,
                                        const std::filesystem::path& tokenizer_dir,
                                        const DemoModelSpec& spec) {
  MB_CHECK(spec.hidden >= 8 && spec.hidden <= 1024 && spec.layers >= 1 && spec.layers <= 16 &&
               spec.experts >= 1 && spec.experts <= 64 && spec.top_k >= 1 &&
               spec.top_k <= spec.experts,
           "demo model spec out of range");
  const Tokenizer tok = Tokenizer::from_dir(tokenizer_dir);
  const auto vocab = static_cast<int64_t>(tok.vocab_size());
  const std::filesystem::path dir = cache_dir / dir_name(spec, vocab);
  if (std::filesystem::exists(dir / "model.safetensors")) return dir;

  std::filesystem::create_directories(cache_dir);
  const std::filesystem::path tmp =
      cache_dir / (dir.filename().string() + ".tmp-" + std::to_string(getpid()));
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  spdlog::info("generating the demo model (random weights, seed {}) in {}", spec.seed,
               dir.string());

  const int64_t H = spec.hidden, heads = 4, kv_heads = 2, hd = 16, I = spec.hidden;
  nlohmann::json cfg{{"architectures", {"Qwen3MoeForCausalLM"}},
                     {"model_type", "qwen3_moe"},
                     {"vocab_size", vocab},
                     {"hidden_size", H},
                     {"intermediate_size", 2 * H},
                     {"moe_intermediate_size", I},
                     {"num_hidden_layers", spec.layers},
                     {"num_attention_heads", heads},
                     {"num_key_value_heads", kv_heads},
                     {"head_dim", hd},
                     {"num_experts", spec.experts},
                     {"num_experts_per_tok", spec.top_k},
                     {"norm_topk_prob", true},
                     {"decoder_sparse_step", 1},
                     {"mlp_only_layers", nlohmann::json::array()},
                     {"hidden_act", "silu"},
                     {"max_position_embeddings", 4096},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 1000000.0},
                     {"tie_word_embeddings", true},
                     {"attention_bias", false},
                     {"torch_dtype", "float32"},
                     {"moebatch_note", "RANDOM WEIGHTS: a demo model; its text is gibberish"}};
  write_text(tmp / "config.json", cfg.dump(2) + "\n");

  SplitMix rng{spec.seed};
  std::vector<Tensor> ts;
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
    ts.push_back(random_tensor(rng, p + "mlp.gate.weight", {spec.experts, H}, w));
    for (int64_t e = 0; e < spec.experts; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      ts.push_back(random_tensor(rng, ep + "gate_proj.weight", {I, H}, w));
      ts.push_back(random_tensor(rng, ep + "up_proj.weight", {I, H}, w));
      ts.push_back(random_tensor(rng, ep + "down_proj.weight", {H, I}, w));
    }
  }
  std::vector<OutTensor> out;
  for (const Tensor& t : ts)
    out.push_back({t.name, t.shape, DType::F32, std::as_bytes(std::span(t.data))});
  write_safetensors(tmp / "model.safetensors", out);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (std::filesystem::exists(tokenizer_dir / f))
      std::filesystem::copy_file(tokenizer_dir / f, tmp / f);
  }
  write_text(tmp / "README.txt",
             "moebatch demo model: qwen3_moe architecture with RANDOM weights (seed " +
                 std::to_string(spec.seed) +
                 "). It exercises the pipeline; the text it generates is gibberish.\n");
  // Another process may have finished first: keep theirs (identical by construction).
  std::error_code ec;
  std::filesystem::rename(tmp, dir, ec);
  if (ec) std::filesystem::remove_all(tmp);
  if (!std::filesystem::exists(dir / "model.safetensors"))
    throw Error("demo model: could not place " + dir.string() + ": " + ec.message());
  return dir;
}

}  // namespace moebatch
