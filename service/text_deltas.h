// Text deltas of one streaming job: generated ids in, text out, decoded exactly as
// make_completion decodes the stored result (special tokens skipped, unknown ids as U+FFFD,
// stop strings cut), so the deltas never include a stop string and, with the tail the final
// result adds, concatenate to the stored text. Held-back bytes (a partial UTF-8 character, a
// possible start of a stop string) are released by later tokens or by that final tail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/streaming.h"
#include "engine/tokenizer/tokenizer.h"

namespace moebatch {

/// See the file comment. Holds a reference to the tokenizer; io thread only.
class TextDeltas {
 public:
  /// `stop`: the job's stop strings (may be empty).
  TextDeltas(const Tokenizer& tokenizer, std::vector<std::string> stop)
      : decoder_(tokenizer, /*skip_special=*/true), matcher_(std::move(stop)) {}

  /// The text these ids complete; empty once a stop string was seen.
  std::string push(const std::vector<int32_t>& ids) {
    std::string out;
    for (int32_t id : ids) {
      if (matcher_.stopped()) break;
      out += matcher_.push(decoder_.push_lenient(id)).text;
    }
    return out;
  }

 private:
  IncrementalDecoder decoder_;
  StopMatcher matcher_;
};

}  // namespace moebatch
