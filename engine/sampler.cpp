#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/error.h"

namespace moebatch {

void validate_sampling(const SamplingParams& p, int64_t vocab) {
  if (!(p.temperature >= 0.0f && p.temperature <= 100.0f)) {
    throw InputError("sampling: temperature must be in [0, 100], got " +
                     std::to_string(p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    throw InputError("sampling: top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  if (p.top_k < 0) throw InputError("sampling: top_k must be >= 0, got " + std::to_string(p.top_k));
  if (p.max_tokens < 1) {
    throw InputError("sampling: max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
  }
  for (int32_t s : p.stop_token_ids) {
    if (s < 0 || s >= vocab) {
      throw InputError("sampling: stop token " + std::to_string(s) + " outside vocab of " +
                       std::to_string(vocab));
    }
  }
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates sorted by logit (ties to the lower id), cut to top-k before the softmax.
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<size_t>(k));
  std::vector<double> prob(idx.size());
  const double mx = logits[idx[0]];
  double sum = 0.0;
  for (size_t i = 0; i < idx.size(); ++i) {
    sum += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  }
  // Nucleus: the shortest prefix whose mass reaches top_p (always at least one token).
  size_t keep = idx.size();
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) {
      cum += prob[i] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = std::accumulate(prob.begin(), prob.begin() + static_cast<long>(keep), 0.0);
  // 53 random bits → u in [0, 1): fully specified, unlike std::uniform_real_distribution.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * kept;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace moebatch
