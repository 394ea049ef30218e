// The bundled demo models: tiny checkpoints with RANDOM weights whose vocabulary matches the
// bundled Qwen3 tokenizer, generated deterministically from a seed on first use into a cache
// directory (nothing large is committed). Two architectures: qwen3_moe (full attention, routed
// experts) and the hybrid qwen3_next (Gated DeltaNet + gated full attention, shared expert).
// Their text is gibberish by construction; they exist so the whole pipeline (tokenizer, engine,
// queue, service) runs anywhere in seconds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace moebatch {

/// Architecture of a demo model.
enum class DemoArch {
  Qwen3Moe,   ///< qwen3_moe: full attention everywhere, routed experts, tied embeddings
  Qwen3Next,  ///< qwen3_next: 3 Gated DeltaNet + 1 gated full-attention layer in every 4,
              ///< routed experts + gated shared expert, separate lm_head
};

/// Shape and seed of a demo model.
struct DemoModelSpec {
  DemoArch arch = DemoArch::Qwen3Moe;  ///< architecture (part of the cache directory's name)
  uint64_t seed = 20261129;            ///< weights are a pure function of this seed
  int64_t hidden = 32;                 ///< hidden size (tiny: the 151k x H embedding dominates)
  int64_t layers = 0;   ///< decoder layers; 0 = the arch's default (qwen3_moe 2, qwen3_next 4)
  int64_t experts = 8;  ///< routed experts per layer
  int64_t top_k = 2;    ///< experts per token
};

/// "qwen3_moe" | "qwen3_next" (the config.json model_type).
const char* demo_arch_name(DemoArch a);

/// The DemoArch named `name` (demo_arch_name spelling); InputError listing the names otherwise.
DemoArch parse_demo_arch(std::string_view name);

/// The default spec with the architecture $MOEBATCH_DEMO_ARCH names (unset or empty:
/// qwen3_moe): how `moebatch demo` and the end-to-end scripts pick the demo architecture.
DemoModelSpec demo_model_spec_from_env();

/// Returns the model directory for `spec` under `cache_dir`, generating it when missing:
/// config.json, model.safetensors, and copies of tokenizer.json and tokenizer_config.json from
/// `tokenizer_dir`. The directory name carries the architecture, shape, vocab and seed, so
/// different specs never share one. Safe against concurrent callers (each writes a private
/// temporary directory and renames it into place).
std::filesystem::path ensure_demo_model(const std::filesystem::path& cache_dir,
                                        const std::filesystem::path& tokenizer_dir,
                                        const DemoModelSpec& spec = {});

/// Default cache: $MOEBATCH_CACHE, else $XDG_CACHE_HOME/moebatch, else ~/.cache/moebatch.
std::filesystem::path default_cache_dir();

/// The bundled tokenizer: <repo>/tests/data/qwen3-tokenizer found next to the running binary
/// (<repo>/<build>/moebatch) or under the current directory; InputError when absent.
std::filesystem::path find_bundled_tokenizer();

}  // namespace moebatch
