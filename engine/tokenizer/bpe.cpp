#include "engine/tokenizer/bpe.h"

#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <unordered_map>

#include "common/error.h"

namespace moebatch::tok {
namespace {

constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};

std::uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<std::uint64_t>(left) << 32) | right;
}

/// Mixes a pair key into a table index (splitmix64 finaliser: ids are small and clustered).
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Pieces longer than this skip the cache: they are rare, and caching them would let one long
// input evict the common short words.
constexpr std::size_t kMaxCachedPieceBytes = 64;
constexpr std::size_t kCacheShards = 16;
static_assert(kMaxCachedPieceBytes <= BpeModel::kMaxShortPieceBytes);
constexpr std::size_t kCacheEntriesPerShard = 16384;

}  // namespace

/// Open-addressing map from (left, right) to (rank, result); about 2x faster than
/// std::unordered_map here because the probe stays within one cache line most of the time.
struct BpeModel::MergeTable {
  struct Slot {
    std::uint64_t key = kEmptyKey;
    std::uint32_t rank = 0;
    TokenId result = 0;
  };
  std::vector<Slot> slots;
  std::uint64_t mask = 0;

  explicit MergeTable(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  /// Inserts or overwrites: for a pair listed twice the later rule wins, as in Hugging Face
  /// (its merge map is collected into a HashMap in file order).
  void insert(std::uint64_t key, std::uint32_t rank, TokenId result) {
    for (std::uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmptyKey || slots[i].key == key) {
        slots[i] = Slot{key, rank, result};
        return;
      }
    }
  }
  const Slot* find(std::uint64_t key) const {
    for (std::uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmptyKey) return nullptr;
    }
  }
};

/// Bounded memo of piece -> ids, sharded so concurrent encoders rarely contend on one mutex.
/// A full shard is simply cleared: the cache only saves time, it never changes results.
class WordCache {
 public:
  bool lookup(std::string_view piece, std::vector<TokenId>& out) {
    Shard& s = shard_for(piece);
    std::lock_guard<std::mutex> lock(s.mu);
    const auto it = s.map.find(piece);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void store(std::string_view piece, const TokenId* ids, std::size_t n) {
    Shard& s = shard_for(piece);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kCacheEntriesPerShard) s.map.clear();
    s.map.emplace(std::string(piece), std::vector<TokenId>(ids, ids + n));
  }

 private:
  // A member, not in the file's anonymous namespace: WordCache (declared in bpe.h) has external
  // linkage, and a field whose type has internal linkage draws -Wsubobject-linkage once this
  // file is compiled inside a unity source.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> map;
  };
  Shard& shard_for(std::string_view piece) {
    // Shard on the last byte and length: cheap, and spreads typical words well enough.
    const std::size_t h = piece.size() * 31 + static_cast<unsigned char>(piece.back());
    return shards_[h % kCacheShards];
  }
  std::array<Shard, kCacheShards> shards_;
};

BpeModel::BpeModel(const std::array<TokenId, 256>& byte_tokens,
                   const std::vector<MergeRule>& merges)
    : byte_tokens_(byte_tokens),
      merges_(std::make_unique<MergeTable>(merges.size())),
      cache_(std::make_unique<WordCache>()),
      merge_count_(merges.size()) {
  for (std::size_t r = 0; r < merges.size(); ++r) {
    merges_->insert(pair_key(merges[r].left, merges[r].right), static_cast<std::uint32_t>(r),
                    merges[r].result);
  }
}

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_tokens_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    encode_piece_uncached(piece, out);
    return;
  }
  if (cache_->lookup(piece, out)) return;
  const std::size_t before = out.size();
  encode_piece_uncached(piece, out);
  cache_->store(piece, out.data() + before, out.size() - before);
}

void BpeModel::encode_piece_uncached(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (piece.size() <= kMaxShortPieceBytes) {
    merge_short(piece, out);
  } else {
    merge_long(piece, out);
  }
}

// Short pieces: symbols and the rank of each adjacent pair live in stack arrays; each step
// scans for the lowest rank (leftmost on ties, the same order as the heap) and re-ranks only
// the two pairs touching the merge. O(n^2) compares but O(n) table lookups, and no allocation:
// faster than the heap for the word-sized pieces that dominate real text.
void BpeModel::merge_short(std::string_view piece, std::vector<TokenId>& out) const {
  constexpr std::uint32_t kNoMerge = ~std::uint32_t{0};
  std::array<TokenId, kMaxShortPieceBytes> sym;
  std::array<std::uint32_t, kMaxShortPieceBytes> rank;  // rank[i]: pair (sym[i], sym[i+1])
  std::array<TokenId, kMaxShortPieceBytes> result;
  std::size_t m = piece.size();
  for (std::size_t i = 0; i < m; ++i) sym[i] = byte_tokens_[static_cast<unsigned char>(piece[i])];
  auto rerank = [&](std::size_t i) {
    const MergeTable::Slot* slot = merges_->find(pair_key(sym[i], sym[i + 1]));
    rank[i] = slot != nullptr ? slot->rank : kNoMerge;
    result[i] = slot != nullptr ? slot->result : 0;
  };
  for (std::size_t i = 0; i + 1 < m; ++i) rerank(i);
  while (m > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < m; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNoMerge) break;
    sym[best] = result[best];
    for (std::size_t i = best + 1; i + 1 < m; ++i) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --m;
    if (best > 0) rerank(best - 1);
    if (best + 1 < m) rerank(best);
  }
  out.insert(out.end(), sym.begin(), sym.begin() + static_cast<std::ptrdiff_t>(m));
}

// Long pieces: symbols in a linked list, candidate merges in a min-heap on (rank, position).
// A candidate remembers the ids it was computed for; once either side has changed it is stale
// and skipped. O(n log n).
void BpeModel::merge_long(std::string_view piece, std::vector<TokenId>& out) const {
  const std::size_t n = piece.size();
  // Symbols start as single bytes; merging i with next[i] keeps slot i and unlinks the right.
  std::vector<TokenId> id(n);
  std::vector<std::int32_t> prev(n), next(n);
  std::vector<bool> dead(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    id[i] = byte_tokens_[static_cast<unsigned char>(piece[i])];
    prev[i] = static_cast<std::int32_t>(i) - 1;
    next[i] = (i + 1 < n) ? static_cast<std::int32_t>(i + 1) : -1;
  }

  struct Candidate {
    std::uint32_t rank;
    std::int32_t pos;
    std::int32_t right;
    TokenId left_id;
    TokenId right_id;
    TokenId result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](std::int32_t left) {
    const std::int32_t right = next[left];
    if (right < 0) return;
    const MergeTable::Slot* slot = merges_->find(pair_key(id[left], id[right]));
    if (slot == nullptr) return;
    heap.push(Candidate{slot->rank, left, right, id[left], id[right], slot->result});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) consider(static_cast<std::int32_t>(i));

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] != c.right || id[c.pos] != c.left_id ||
        id[c.right] != c.right_id) {
      continue;
    }
    id[c.pos] = c.result;
    dead[c.right] = true;
    next[c.pos] = next[c.right];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    if (prev[c.pos] >= 0) consider(prev[c.pos]);
    consider(c.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

}  // namespace moebatch::tok
