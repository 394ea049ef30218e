// Byte-level BPE model: token ids for single bytes, merge rules ranked by their order in
// tokenizer.json, and the merge loop applied to each pre-tokenized piece. The loop keeps the
// piece's symbols in a linked list and the candidate merges in a min-heap ordered by (rank,
// position), the order Hugging Face applies them in, so a piece of n bytes costs O(n log n)
// instead of the naive O(n^2); pieces up to 128 bytes use a simpler allocation-free scan with
// the same merge order. Results for short pieces are memoised in a bounded cache shared
// by all threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch::tok {

/// Token id type used across the tokenizer.
using TokenId = std::uint32_t;

/// One merge rule: `left` + `right` -> `result`, applied in increasing `rank`.
struct MergeRule {
  TokenId left;    ///< id of the left symbol
  TokenId right;   ///< id of the right symbol
  TokenId result;  ///< id of the concatenation
};

class WordCache;

/// The BPE merge model over raw bytes.
class BpeModel {
 public:
  /// `byte_tokens[b]` is the id of the one-byte token for byte b; `merges` are in rank order.
  BpeModel(const std::array<TokenId, 256>& byte_tokens, const std::vector<MergeRule>& merges);
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;

  /// Appends the ids of one pre-tokenized piece (raw bytes, non-empty) to `out`.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;

  /// Same without the cache: the reference path, also used for long pieces.
  void encode_piece_uncached(std::string_view piece, std::vector<TokenId>& out) const;

  /// Pieces up to this many bytes use the allocation-free short path.
  static constexpr std::size_t kMaxShortPieceBytes = 128;

  /// Number of merge rules.
  std::size_t merge_count() const { return merge_count_; }

 private:
  struct MergeTable;
  void merge_short(std::string_view piece, std::vector<TokenId>& out) const;
  void merge_long(std::string_view piece, std::vector<TokenId>& out) const;
  std::array<TokenId, 256> byte_tokens_;
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<WordCache> cache_;
  std::size_t merge_count_ = 0;
};

}  // namespace moebatch::tok
