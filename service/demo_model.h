// The bundled demo model: a tiny qwen3_moe checkpoint with RANDOM weights whose vocabulary
// matches the bundled Qwen3 tokenizer, generated deterministically from a seed on first use
// into a cache directory (nothing large is committed). Its text is gibberish by construction;
// it exists so the whole pipeline (tokenizer, engine, queue, service) runs anywhere in seconds.
#pragma once

#include <cstdint>
#include <filesystem>

namespace moebatch {

/// Shape and seed of the demo model.
struct DemoModelSpec {
  uint64_t seed = 20261129;  ///< weights are a pure function of this seed
  int64_t hidden = 32;       ///< hidden size (tiny: the tied 151k x H embedding dominates)
  int64_t layers = 2;        ///< decoder layers
  int64_t experts = 8;       ///< routed experts per layer
  int64_t top_k = 2;         ///< experts per token
};

/// Returns the model directory for `spec` under `cache_dir`, generating it when missing:
/// config.json, model.safetensors (tied embeddings), and copies of tokenizer.json and
/// tokenizer_config.json from `tokenizer_dir`. Safe against concurrent callers (each writes a
/// private temporary directory and renames it into place).
std::filesystem::path ensure_demo_model(const std::filesystem::path& cache_dir,
                                        const std::filesystem::path& tokenizer_dir,
                                        const DemoModelSpec& spec = {});

/// Default cache: $MOEBATCH_CACHE, else $XDG_CACHE_HOME/moebatch, else ~/.cache/moebatch.
std::filesystem::path default_cache_dir();

/// The bundled tokenizer: <repo>/tests/data/qwen3-tokenizer found next to the running binary
/// (<repo>/<build>/moebatch) or under the current directory; InputError when absent.
std::filesystem::path find_bundled_tokenizer();

}  // namespace moebatch
