// Reads a fixture's reference.safetensors (see tests/data/FIXTURES.md) and compares logits.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/safetensors.h"
#include "tests/engine/test_util.h"

namespace moebatch {

/// One reference prompt with its oracle outputs.
struct RefPrompt {
  std::vector<int32_t> prompt;       ///< [T]
  std::vector<float> logits;         ///< [T, vocab]
  std::vector<int32_t> greedy;       ///< [N]
  std::vector<float> greedy_margin;  ///< [N]
  std::vector<float> route_gap;      ///< [T] (inf for dense models)
};

inline std::vector<float> floats(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get_f32(i);
  return v;
}

inline std::vector<int32_t> ints(const TensorView& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int32_t>(t.get_f32(i));
  return v;
}

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
    } else {
      r.route_gap.assign(r.prompt.size(), std::numeric_limits<float>::infinity());
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// ‖a − b‖ / ‖b‖ over one row.
inline double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

/// Number of leading positions whose router gaps (and all earlier ones) exceed `thr`.
inline size_t comparable_prefix(const std::vector<float>& gaps, float thr) {
  size_t t = 0;
  while (t < gaps.size() && gaps[t] > thr) ++t;
  return t;
}

/// An engine over the CPU backend for a fixture.
inline std::unique_ptr<Engine> make_engine(const std::string& model, int tp = 1,
                                           EngineOptions eo = {},
                                           ExpertSplit split = ExpertSplit::Intermediate) {
  CpuBackendOptions o;
  o.tp = tp;
  o.threads = 2;
  o.kv_cache_bytes = 16 << 20;
  o.expert_split = split;
  return std::make_unique<Engine>(std::make_unique<CpuBackend>(test_data_dir() + "/" + model, o),
                                  eo);
}

}  // namespace moebatch
