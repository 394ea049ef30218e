// Added tokens (`<|im_start|>`, `<think>`, ...) are cut out of the raw text before
// normalization and pre-tokenization, as Hugging Face's AddedVocabulary does: at each position
// the leftmost match wins, and among matches there the longest.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/bpe.h"

namespace moebatch::tok {

/// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  TokenId id;           ///< its id
  std::string content;  ///< exact text it matches
  bool special;         ///< special tokens can be excluded from matching and from decoding
};

/// One piece of text after cutting out added tokens: plain text, or one added token.
struct Segment {
  std::string_view text;  ///< plain text (empty when this is a token)
  bool is_token;          ///< true when `id` is set
  TokenId id;             ///< the added token's id
};

/// Leftmost-longest matcher over the added tokens' contents.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  /// Cuts `text` into plain and token segments, in order. With `match_special` false only the
  /// non-special added tokens are recognised (special ones stay plain text).
  std::vector<Segment> split(std::string_view text, bool match_special) const;

  /// All added tokens, in the order given.
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  // For each first byte, indices into tokens_ sorted by decreasing content length.
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_;
};

}  // namespace moebatch::tok
