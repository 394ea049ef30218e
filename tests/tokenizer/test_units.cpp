// Unit tests of the pipeline stages: UTF-8 handling, the byte-level alphabet, the regex
// translation and splitter, NFC windows, added-token matching and the BPE merge loop.
#include <gtest/gtest.h>

#include <map>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

std::string lossy(const std::string& s) {
  std::string out;
  tok::utf8_append_lossy(s, out);
  return out;
}
const std::string kRep = "\xEF\xBF\xBD";

TEST(Utf8, LossyDecodeReplacesMaximalSubparts) {
  // Expected values are what Rust's String::from_utf8_lossy returns for these bytes.
  EXPECT_EQ(lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(lossy("\xF0\x90\x80" "a"), kRep + "a");         // truncated 4-byte: one U+FFFD
  EXPECT_EQ(lossy("\xE0\x80"), kRep + kRep);                 // overlong lead, then stray byte
  EXPECT_EQ(lossy("\xED\xA0\x80"), kRep + kRep + kRep);     // surrogate
  EXPECT_EQ(lossy("\xC3\xA9\xFF\xC3\xA9"), "\xC3\xA9" + kRep + "\xC3\xA9");
  EXPECT_EQ(lossy("x\xE4\xB8"), "x" + kRep);                // truncated at end
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kRep + kRep + kRep + kRep);  // above U+10FFFF
}

TEST(Utf8, IncompleteTailOnlyForValidPrefixes) {
  EXPECT_EQ(tok::utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xE4"), 1u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xE4\xB8"), 2u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xE4\xB8\xAD"), 0u);  // complete
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xE0\x80"), 0u);      // already invalid: emit now
  EXPECT_EQ(tok::utf8_incomplete_tail("\x80\x80\x80"), 0u);
  EXPECT_EQ(tok::utf8_valid_prefix("ab\xC3\xA9z\xFF"), 5u);
}

TEST(ByteLevel, AlphabetIsABijectionWithGpt2Spelling) {
  const tok::ByteLevelAlphabet a;
  EXPECT_EQ(a.char_of(' '), U'\u0120');   // Ġ
  EXPECT_EQ(a.char_of('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(a.char_of('A'), U'A');
  EXPECT_EQ(a.char_of(0xAD), U'\u0143');  // soft hyphen is not printable
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(a.to_bytes(a.from_bytes(all)), all);
  EXPECT_FALSE(a.to_bytes("a b").has_value());  // plain space is outside the alphabet
}

std::vector<std::string> pieces(const tok::RegexSplitter& r, const std::string& text) {
  std::vector<std::string> out;
  r.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(Pretokenizer, QwenPatternPiecesIncludingLookahead) {
  const tok::RegexSplitter r(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  EXPECT_TRUE(r.jit());
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(r, "a   b"), (V{"a", "  ", " b"}));  // (?!\S) leaves one space for " b"
  EXPECT_EQ(pieces(r, "HE'LL 123"), (V{"HE", "'LL", " ", "1", "2", "3"}));
  EXPECT_EQ(pieces(r, "x  \n\ny"), (V{"x", "  \n\n", "y"}));
  EXPECT_EQ(pieces(r, "end   "), (V{"end", "   "}));
  // U+180E is not White_Space (Oniguruma) although PCRE2's own \s matches it; U+0085 is.
  EXPECT_EQ(pieces(r, "a\u180Eb"), (V{"a", "\u180Eb"}));
  EXPECT_EQ(pieces(r, "a\u0085\u0085b"), (V{"a", "\u0085", "\u0085b"}));
  std::string joined;
  for (const auto& p : pieces(r, "Mixed: 中文, emoji 😀!  ok\r\n")) joined += p;
  EXPECT_EQ(joined, "Mixed: 中文, emoji 😀!  ok\r\n");
}

TEST(Pretokenizer, TranslatesWhitespaceEscapes) {
  EXPECT_EQ(tok::translate_onig_pattern("a"), "a");
  EXPECT_NE(tok::translate_onig_pattern("\\s").find("\\x{85}"), std::string::npos);
  EXPECT_EQ(tok::translate_onig_pattern("[^\\s]").rfind("[^\\x{9}", 0), 0u);
  EXPECT_EQ(tok::translate_onig_pattern("\\\\s"), "\\\\s");  // escaped backslash, then 's'
  EXPECT_THROW(tok::translate_onig_pattern("[\\S]"), InputError);
}

TEST(Normalizer, NfcWindowsMatchWholeStringNfc) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const tok::Normalizer n(tok::Normalizer::Kind::kNfc);
  for (int i = 0; i < 200; ++i) {
    const std::string s = random_text(rng, 40);
    std::string scratch;
    EXPECT_EQ(std::string(n.apply(s, scratch)), nfc(s));
  }
  std::string scratch;
  EXPECT_EQ(n.apply("e\u0301", scratch), "\u00e9");  // ASCII base + combining mark composes
  const std::string ascii = "pure ascii";
  EXPECT_EQ(n.apply(ascii, scratch).data(), ascii.data());  // no copy
}

TEST(AddedTokens, LeftmostLongestMatch) {
  const tok::AddedTokenMatcher m({{1, "<a>", true}, {2, "<a><b>", false}, {3, "b>", false}});
  const auto segs = m.split("x<a><b>y<a>b>", true);
  ASSERT_EQ(segs.size(), 5u);
  EXPECT_EQ(segs[0].text, "x");
  EXPECT_EQ(segs[1].id, 2u);  // longest at the leftmost position
  EXPECT_EQ(segs[2].text, "y");
  EXPECT_EQ(segs[3].id, 1u);
  EXPECT_EQ(segs[4].id, 3u);
  const auto plain = m.split("<a>", false);  // special "<a>" not matched
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_FALSE(plain[0].is_token);
}

/// Textbook BPE: repeatedly merge the lowest-ranked adjacent pair, leftmost first. O(n^2),
/// obviously correct; the heap implementation must agree with it.
std::vector<tok::TokenId> naive_bpe(const std::string& word,
                                    const std::map<std::pair<tok::TokenId, tok::TokenId>,
                                                   std::pair<std::size_t, tok::TokenId>>& rank) {
  std::vector<tok::TokenId> s;
  for (const char c : word) s.push_back(static_cast<unsigned char>(c));
  while (true) {
    std::size_t best = SIZE_MAX, at = 0;
    tok::TokenId result = 0;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const auto it = rank.find({s[i], s[i + 1]});
      if (it != rank.end() && it->second.first < best) {
        best = it->second.first;
        at = i;
        result = it->second.second;
      }
    }
    if (best == SIZE_MAX) return s;
    s[at] = result;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

TEST(Bpe, HeapMergeEqualsNaiveMergeOnRandomRules) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    std::array<tok::TokenId, 256> bytes{};
    for (int b = 0; b < 256; ++b) bytes[b] = static_cast<tok::TokenId>(b);
    std::vector<tok::MergeRule> rules;
    std::map<std::pair<tok::TokenId, tok::TokenId>, std::pair<std::size_t, tok::TokenId>> rank;
    tok::TokenId next = 256;
    for (int r = 0; r < 40; ++r) {
      // Rules over 'a'..'c' and earlier results, so merges chain and compete.
      auto pick = [&] { return rng() % 3 == 0 && next > 256 ? 256 + rng() % (next - 256)
                                                            : 'a' + rng() % 3; };
      const tok::TokenId l = static_cast<tok::TokenId>(pick());
      const tok::TokenId rr = static_cast<tok::TokenId>(pick());
      if (rank.count({l, rr})) continue;
      rules.push_back({l, rr, next});
      rank[{l, rr}] = {rules.size() - 1, next};
      ++next;
    }
    const tok::BpeModel model(bytes, rules);
    for (int w = 0; w < 50; ++w) {
      // Mostly word-sized pieces (short path), every tenth above 128 bytes (heap path).
      const std::size_t n = w % 10 == 0 ? tok::BpeModel::kMaxShortPieceBytes + 1 + rng() % 200
                                        : 1 + rng() % 40;
      std::string word;
      for (std::size_t k = 0; k < n; ++k) word.push_back("abc"[rng() % 3]);
      std::vector<tok::TokenId> got;
      model.encode_piece(word, got);
      ASSERT_EQ(got, naive_bpe(word, rank)) << word;
    }
  }
}

TEST(Bpe, TinyTokenizerMergesByRank) {
  const Tokenizer tk = Tokenizer::from_json(tiny_tokenizer_json().dump());
  EXPECT_EQ(tk.encode("abc"), (std::vector<TokenId>{257}));
  EXPECT_EQ(tk.encode("abab"), (std::vector<TokenId>{256, 256}));
  EXPECT_EQ(tk.encode("ab<|end|>c"), (std::vector<TokenId>{256, 258, 'c'}));
  EXPECT_EQ(tk.decode(std::vector<TokenId>{257, 258}), "abc<|end|>");
}

}  // namespace
}  // namespace moebatch::test
