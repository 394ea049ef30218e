// Random token prompts for engine tests (fresh inputs each run; tests print what they need to
// replay a failure).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moebatch::test {

/// len token ids drawn uniformly from [0, vocab) with rng (any std uniform random bit generator).
template <typename Rng>
std::vector<int32_t> random_prompt(Rng& rng, size_t len, int64_t vocab) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

}  // namespace moebatch::test
