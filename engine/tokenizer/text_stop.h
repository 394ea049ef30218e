// Stop strings over the detokenized text: the engine's StopStrings watcher built from a
// tokenizer. Tokens are decoded as the service decodes a result (special tokens skipped, ids the
// tokenizer does not know as U+FFFD), so the engine stops exactly where the service later cuts
// the text.
#pragma once

#include <string>
#include <vector>

#include "engine/stop_strings.h"
#include "engine/tokenizer/streaming.h"

namespace moebatch {

/// IncrementalDecoder + StopMatcher for one sequence. Holds a reference to the tokenizer.
class TextStopStrings final : public StopStrings {
 public:
  /// `stops`: non-empty UTF-8 strings (InputError otherwise).
  TextStopStrings(const Tokenizer& tokenizer, std::vector<std::string> stops)
      : decoder_(tokenizer, /*skip_special=*/true), matcher_(std::move(stops)) {}
  bool push(int32_t token) override { return matcher_.push(decoder_.push_lenient(token)).stopped; }

 private:
  IncrementalDecoder decoder_;
  StopMatcher matcher_;
};

}  // namespace moebatch
