// A fixture's float64 oracle (reference.safetensors, see tests/data/FIXTURES.md), the rule for
// which positions are comparable, a CPU engine over a fixture, and the error a bad config.json
// gets. The generic pieces (fixture paths, rel_err) are the shared harness's, in tests/common.
#pragma once

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "tests/common/compare.h"
#include "tests/common/files.h"

namespace moebatch {

// The engine and GPU tests live in namespace moebatch and call these unqualified.
using test::rel_err;
using test::test_data_dir;

/// One reference prompt with its oracle outputs.
struct RefPrompt {
  std::vector<int32_t> prompt;       ///< [T]
  std::vector<float> logits;         ///< [T, vocab]
  std::vector<int32_t> greedy;       ///< [N]
  std::vector<float> greedy_margin;  ///< [N]
  std::vector<float> route_gap;      ///< [T] (inf when the fixture has no router data)
  bool route_known = false;          ///< the fixture stores router gaps (MoE fixtures but one)
};

/// A tensor's values as floats.
inline std::vector<float> floats(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get_f32(i);
  return v;
}

/// A tensor's values as int32 (stored as any dtype).
inline std::vector<int32_t> ints(const TensorView& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int32_t>(t.get_f32(i));
  return v;
}

/// The reference prompts of fixture `model`, in file order.
inline std::vector<RefPrompt> load_reference(const std::string& model) {
  SafetensorsFile f(test_data_dir() + "/" + model + "/reference.safetensors");
  std::vector<RefPrompt> out;
  for (int i = 0;; ++i) {
    const std::string s = std::to_string(i);
    if (!f.tensors().count("prompt." + s)) break;
    RefPrompt r;
    r.prompt = ints(f.at("prompt." + s));
    r.logits = floats(f.at("logits." + s));
    r.greedy = ints(f.at("greedy." + s));
    r.greedy_margin = floats(f.at("greedy_margin." + s));
    if (f.tensors().count("route_logit_gap." + s)) {
      r.route_gap = floats(f.at("route_logit_gap." + s));
      r.route_known = true;
    } else {
      r.route_gap.assign(r.prompt.size(), std::numeric_limits<float>::infinity());
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// Number of leading positions whose router gaps (and all earlier ones) exceed `thr`.
inline size_t comparable_prefix(const std::vector<float>& gaps, float thr) {
  size_t t = 0;
  while (t < gaps.size() && gaps[t] > thr) ++t;
  return t;
}

/// The model path of fixture `model`: its directory, or the .gguf file inside a GGUF fixture.
inline std::string fixture_path(const std::string& model) {
  const std::filesystem::path dir = test_data_dir() + "/" + model;
  if (std::filesystem::exists(dir / "config.json")) return dir.string();
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".gguf") return e.path().string();
  return dir.string();
}

/// The factory's spec of a CPU engine over fixture `model` (2 threads, 16 MiB of KV).
inline EngineSpec fixture_spec(const std::string& model, int tp = 1, EngineOptions eo = {},
                               ExpertSplit split = ExpertSplit::Intermediate) {
  EngineSpec spec;
  spec.model = fixture_path(model);
  spec.tensor_parallel_size = tp;
  spec.threads = 2;
  spec.kv_cache_bytes = 16 << 20;
  spec.expert_split = split;
  spec.scheduler = eo;
  return spec;
}

/// An engine over the CPU backend for a fixture, built by the factory.
inline std::unique_ptr<Engine> make_engine(const std::string& model, int tp = 1,
                                           EngineOptions eo = {},
                                           ExpertSplit split = ExpertSplit::Intermediate) {
  return moebatch::make_engine(fixture_spec(model, tp, eo, split)).engine;
}

/// The message of the InputError that parsing `j` as a model's config.json throws; "" when it
/// parses.
inline std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

/// A greedy request (temperature 0), optionally keeping every sampled step's logits.
inline Request greedy_request(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens,
                              bool keep_logits = false) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.keep_logits = keep_logits;
  return r;
}

}  // namespace moebatch
