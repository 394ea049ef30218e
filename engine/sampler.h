// Token sampling from one row of logits: greedy, or temperature with top-k / top-p, driven by a
// per-request RNG so a sequence's samples never depend on its batch neighbours.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moebatch {

/// How to pick the next token and when to stop.
struct GenerationParams {
  float temperature = 0.0f;  ///< 0 = greedy (argmax, ties to the lower id)
  int64_t top_k = 0;         ///< keep the k most likely tokens; 0 = all
  float top_p = 1.0f;        ///< keep the smallest set with cumulative probability >= top_p
  uint64_t seed = 0;         ///< seed of this request's RNG
  int64_t max_tokens = 16;   ///< generated tokens at most (>= 1)
  std::vector<int32_t> stop_token_ids;  ///< generation ends after emitting one of these
};

/// Validates ranges (temperature >= 0, top_p in (0, 1], max_tokens >= 1, top_k >= 0, stop ids
/// inside the vocab); throws InputError naming the field.
void validate_sampling(const GenerationParams& p, int64_t vocab);

/// Picks a token from logits[0..vocab). Uses `rng` only when temperature > 0.
int32_t sample_token(const float* logits, int64_t vocab, const GenerationParams& p,
                     std::mt19937_64& rng);

}  // namespace moebatch
