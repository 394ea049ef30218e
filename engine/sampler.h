// Token sampling from one row of logits: greedy, or temperature with top-k / top-p. The random
// draw of a sequence's n-th token is uniform01(seed, n) (common/random.h), the same draw the GPU
// sampler makes, so a sequence's samples never depend on its batch neighbours or the backend.
#pragma once

#include <cstdint>
#include <vector>

namespace moebatch {

/// How to pick the next token and when to stop.
struct GenerationParams {
  /// 0 = greedy (argmax, ties to the lower id). Default 1.0, as in OpenAI's API and the job
  /// queue: a request that says nothing samples from the model's distribution.
  float temperature = 1.0f;
  int64_t top_k = 0;         ///< keep the k most likely tokens; 0 = all
  float top_p = 1.0f;        ///< keep the smallest set with cumulative probability >= top_p
  uint64_t seed = 0;         ///< seed of this request's RNG
  int64_t max_tokens = 16;   ///< generated tokens at most (>= 1)
  std::vector<int32_t> stop_token_ids;  ///< generation ends after emitting one of these
};

/// Validates ranges (temperature >= 0, top_p in (0, 1], max_tokens >= 1, top_k >= 0, stop ids
/// inside the vocab); throws InputError naming the field.
void validate_sampling(const GenerationParams& p, int64_t vocab);

/// Picks a token from logits[0..vocab); `step` is the number of tokens the sequence generated
/// before this one (the draw counter; unused when greedy).
int32_t sample_token(const float* logits, int64_t vocab, const GenerationParams& p, uint64_t step);

}  // namespace moebatch
