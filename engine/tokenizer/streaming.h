// Streaming output: turning generated ids into text pieces one at a time, and cutting the
// text at stop strings. Both hold back just enough to be exact: the decoder never emits part
// of a UTF-8 character, and the stop matcher never emits text that might turn out to be the
// start of a stop string. Concatenating every piece gives exactly Tokenizer::decode of all ids
// (resp. the text up to the first stop string).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace moebatch {

/// Incremental detokenizer for one sequence. Holds a reference to the tokenizer.
class IncrementalDecoder {
 public:
  /// `skip_special`: drop special tokens from the text, as decode(ids, true) does.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  /// Adds one generated id; returns the text completed by it (often empty for CJK or emoji,
  /// whose bytes span several tokens). InputError for an unknown id.
  std::string push(TokenId id);

  /// As push(), but an id the tokenizer does not know (a model vocabulary padded past the
  /// tokenizer's, as Qwen3's is) flushes the held bytes and becomes U+FFFD instead of failing.
  std::string push_lenient(int64_t id);

  /// Flushes held bytes at end of sequence; a truncated character becomes U+FFFD.
  std::string finish();

  /// Bytes currently held back (0..3).
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

/// Finds the first occurrence of any stop string in a stream of text pieces.
class StopMatcher {
 public:
  /// `stops` must be non-empty strings (InputError otherwise); an empty list never stops.
  explicit StopMatcher(std::vector<std::string> stops);

  /// Result of one push.
  struct Step {
    std::string text;            ///< text safe to emit now (never includes the stop string)
    bool stopped = false;        ///< a stop string was found; later pushes return nothing
    std::size_t stop_index = 0;  ///< which stop string, when stopped
  };

  /// Feeds the next decoded piece.
  Step push(std::string_view piece);

  /// End of generation without a stop: releases the held-back text.
  std::string finish();

  /// Whether a stop string has been seen.
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace moebatch
