#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/error.h"
#include "common/random.h"

namespace moebatch {

void validate_sampling(const GenerationParams& p, int64_t vocab) {
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

namespace {

/// Candidate ids whose leading part is kept sorted by logit (ties to the lower id), grown on
/// demand: sampling usually needs only the few most likely tokens, and sorting a 150k-entry
/// vocabulary for every generated token would dominate the step on CPU.
class SortedCandidates {
 public:
  SortedCandidates(const float* logits, int64_t vocab)
      : logits_(logits), idx_(static_cast<size_t>(vocab)) {
    std::iota(idx_.begin(), idx_.end(), 0);
  }
  /// Makes positions [0, n) hold the n most likely ids in order; returns min(n, size).
  size_t ensure_sorted(size_t n) {
    n = std::min(n, idx_.size());
    if (n <= sorted_) return n;
    auto by_logit = [this](int32_t a, int32_t b) {
      return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
    };
    const auto first = idx_.begin() + static_cast<long>(sorted_);
    const auto mid = idx_.begin() + static_cast<long>(n);
    std::nth_element(first, mid - 1, idx_.end(), by_logit);
    std::sort(first, mid, by_logit);
    sorted_ = n;
    return n;
  }
  /// The id at rank i; i must be below the last ensure_sorted() bound.
  int32_t operator[](size_t i) const { return idx_[i]; }
  /// Sorted-prefix length needed to reach rank i, growing geometrically.
  size_t grow_to_cover(size_t i) { return ensure_sorted(std::max<size_t>(2 * sorted_, i + 64)); }
  size_t size() const { return idx_.size(); }

 private:
  const float* logits_;
  std::vector<int32_t> idx_;
  size_t sorted_ = 0;
};

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab, const GenerationParams& p,
                     uint64_t step) {
  if (p.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates are the top-k (all tokens when top_k = 0), ranked by logit.
  SortedCandidates cand(logits, vocab);
  const size_t k = static_cast<size_t>(p.top_k > 0 ? std::min(p.top_k, vocab) : vocab);
  const float mx = *std::max_element(logits, logits + vocab);
  auto weight = [&](int32_t id) { return std::exp((double(logits[id]) - mx) / p.temperature); };
  // Softmax normalizer over the candidate set.
  double sum = 0.0;
  if (k == static_cast<size_t>(vocab)) {
    for (int64_t i = 0; i < vocab; ++i) sum += weight(static_cast<int32_t>(i));
  } else {
    cand.ensure_sorted(k);
    for (size_t i = 0; i < k; ++i) sum += weight(cand[i]);
  }
  // Nucleus: the shortest ranked prefix whose mass reaches top_p (always at least one token).
  size_t keep = k;
  double kept = sum;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t avail = 0;
    for (size_t i = 0; i < k; ++i) {
      if (i >= avail) avail = std::min(k, cand.grow_to_cover(i));
      cum += weight(cand[i]);
      if (cum / sum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    kept = std::min(cum, sum);
  }
  // The GPU sampler's draw (kernels/sampling.cuh): u in [0, 1) from (seed, step).
  const double u = static_cast<double>(uniform01(p.seed, step)) * kept;
  double cum = 0.0;
  size_t avail = 0;
  for (size_t i = 0; i < keep; ++i) {
    if (i >= avail) avail = std::min(keep, cand.grow_to_cover(i));
    cum += weight(cand[i]);
    if (u < cum) return cand[i];
  }
  // Rounding left u at the very top of the mass: the last kept candidate.
  cand.ensure_sorted(keep);
  return cand[keep - 1];
}

}  // namespace moebatch
