// Incremental detokenization and stop strings.
#include <gtest/gtest.h>

#include "engine/tokenizer/streaming.h"
#include "engine/tokenizer/utf8.h"
#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

bool valid_utf8(const std::string& s) { return tok::utf8_valid_prefix(s) == s.size(); }

TEST(IncrementalDecoder, PiecesAreValidUtf8AndConcatenateToDecode) {
  const Tokenizer& tk = qwen3();
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int held_back = 0;
  for (int i = 0; i < 100; ++i) {
    const auto ids = tk.encode(random_text(rng, 40));
    IncrementalDecoder dec(tk);
    std::string all;
    for (const TokenId id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(valid_utf8(piece));
      held_back += dec.pending_bytes() > 0;
      all += piece;
    }
    all += dec.finish();
    ASSERT_EQ(all, tk.decode(ids));
  }
  EXPECT_GT(held_back, 0);  // the random text did exercise characters split across ids
}

TEST(IncrementalDecoder, HoldsBackASplitCharacterUntilComplete) {
  const Tokenizer& tk = qwen3();
  // "😀" is F0 9F 98 80; one-byte tokens make the split explicit.
  IncrementalDecoder dec(tk);
  EXPECT_EQ(dec.push(*tk.token_to_id("\xF0")), "");
  EXPECT_EQ(dec.push(*tk.token_to_id("\x9F")), "");
  EXPECT_EQ(dec.push(*tk.token_to_id("\x98")), "");
  EXPECT_EQ(dec.pending_bytes(), 3u);
  EXPECT_EQ(dec.push(*tk.token_to_id("\x80")), "\xF0\x9F\x98\x80");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.finish(), "");
}

TEST(IncrementalDecoder, InvalidAndTruncatedBytesMatchLossyDecode) {
  const Tokenizer& tk = qwen3();
  // A lone continuation byte, then a truncated 3-byte lead at the end of the sequence.
  const std::vector<TokenId> ids = {*tk.token_to_id("a"), *tk.token_to_id("\x80"),
                                    *tk.token_to_id("b"), *tk.token_to_id("\xE4")};
  IncrementalDecoder dec(tk);
  std::string all;
  for (const TokenId id : ids) all += dec.push(id);
  EXPECT_EQ(all, "a\xEF\xBF\xBD" "b");
  all += dec.finish();
  EXPECT_EQ(all, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(all, tk.decode(ids));
}

TEST(IncrementalDecoder, SkipSpecialMatchesDecode) {
  const Tokenizer& tk = qwen3();
  const auto ids = tk.encode("<|im_start|>assistant\n答案<|im_end|>");
  IncrementalDecoder dec(tk, /*skip_special=*/true);
  std::string all;
  for (const TokenId id : ids) all += dec.push(id);
  all += dec.finish();
  EXPECT_EQ(all, tk.decode(ids, true));
  EXPECT_EQ(all, "assistant\n答案");
}

/// Feeds `pieces` and returns (emitted text, stopped).
std::pair<std::string, bool> run_stops(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  bool stopped = false;
  for (const auto& p : pieces) {
    auto step = m.push(p);
    out += step.text;
    stopped = stopped || step.stopped;
  }
  if (!stopped) out += m.finish();
  return {out, stopped};
}

TEST(StopMatcher, FindsStopSplitAcrossPieces) {
  StopMatcher m({"</answer>", "STOP"});
  auto s1 = m.push("The result is 4</an");
  EXPECT_EQ(s1.text, "The result is 4");  // "</an" held: could start a stop string
  EXPECT_FALSE(s1.stopped);
  auto s2 = m.push("swer> trailing");
  EXPECT_TRUE(s2.stopped);
  EXPECT_EQ(s2.stop_index, 0u);
  EXPECT_EQ(s2.text, "");
  EXPECT_TRUE(m.push("more").stopped);
}

TEST(StopMatcher, ReleasesHeldTextWhenItDoesNotBecomeAStop) {
  StopMatcher m({"STOP"});
  auto a = m.push("ST");
  EXPECT_EQ(a.text, "");
  auto b = m.push("ART");
  EXPECT_EQ(b.text, "START");
  auto c = m.push("ST");
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(m.finish(), "ST");
}

TEST(StopMatcher, RandomSplitsGiveTextBeforeFirstStop) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> stops = {"<|im_end|>", "\n\nUser:", "终止"};
  for (int i = 0; i < 200; ++i) {
    std::string text = random_text(rng, 30);
    const bool with_stop = rng() % 2 == 0;
    if (with_stop) text += stops[rng() % stops.size()] + random_text(rng, 5);
    // Expected: text up to the earliest stop occurrence.
    std::size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    const std::string expect = text.substr(0, cut);
    // Split into pieces at character boundaries, as a decoder would produce them.
    std::vector<std::string> pieces;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t end = std::min(text.size(), pos + 1 + rng() % 6);
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      pieces.push_back(text.substr(pos, end - pos));
      pos = end;
    }
    StopMatcher m(stops);
    const auto [out, stopped] = run_stops(m, pieces);
    ASSERT_EQ(out, expect);
    ASSERT_EQ(stopped, cut != std::string::npos);
  }
}

TEST(StopMatcher, EmptyStopStringIsRejected) {
  EXPECT_THROW(StopMatcher({"ok", ""}), InputError);
  StopMatcher none({});
  EXPECT_EQ(none.push("anything").text, "anything");
}

}  // namespace
}  // namespace moebatch::test
