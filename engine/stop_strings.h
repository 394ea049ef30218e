// The engine's view of stop strings: a per-request watcher fed every generated token, so a
// sequence ends at the step whose token completes a match (vLLM's incremental stop check)
// instead of generating to max_tokens. The engine knows only token ids; the watcher that
// detokenizes is engine/tokenizer/text_stop.h.
#pragma once

#include <cstdint>

namespace moebatch {

/// Watches one sequence's generated text for stop strings.
class StopStrings {
 public:
  virtual ~StopStrings() = default;
  /// Adds one generated token; true once the text contains a stop string.
  virtual bool push(int32_t token) = 0;
};

}  // namespace moebatch
