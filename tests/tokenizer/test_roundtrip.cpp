// Properties on fresh random text: decode(encode(s)) == NFC(s); the cached and uncached BPE
// paths agree; long inputs stay fast.
#include <gtest/gtest.h>

#include <chrono>

#include "tests/common/sanitizers.h"
#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

TEST(TokenizerRoundTrip, RandomUnicodeDecodesToItsNfc) {
  const Tokenizer& tk = qwen3();
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng, 1 + static_cast<int>(rng() % 60));
    const auto ids = tk.encode(s);
    ASSERT_EQ(tk.decode(ids), nfc(s)) << "input of " << s.size() << " bytes";
  }
}

TEST(TokenizerRoundTrip, EncodingIsStableAcrossCalls) {
  // The second call is served from the piece cache; it must give the same ids.
  const Tokenizer& tk = qwen3();
  std::mt19937_64 rng(std::random_device{}());
  const std::string s = random_text(rng, 400);
  EXPECT_EQ(tk.encode(s), tk.encode(s));
}

TEST(TokenizerRoundTrip, PiecesAreIndependentOfSurroundingText) {
  // Pre-tokenization cuts at a newline followed by a letter, so encoding a+"\n"+b must equal
  // encoding a+"\n" followed by encoding b.
  const Tokenizer& tk = qwen3();
  const std::string a = "Mixture of experts:";
  const std::string b = "Routers pick 8 of 128.";
  auto joined = tk.encode(a + "\n");
  const auto tail = tk.encode(b);
  joined.insert(joined.end(), tail.begin(), tail.end());
  EXPECT_EQ(tk.encode(a + "\n" + b), joined);
}

TEST(TokenizerRoundTrip, MultiMegabyteInputsFinishFast) {
  const Tokenizer& tk = qwen3();
  std::mt19937_64 rng(7);
  std::string mixed;
  while (mixed.size() < (std::size_t{2} << 20)) mixed += random_text(rng, 200);
  // Adversarial shapes for the regex and for BPE: one 1 MB "word", 1 MB of spaces ending in a
  // letter, 1 MB of one CJK character repeated.
  const std::string one_word(1 << 20, 'a');
  const std::string spaces = std::string(1 << 20, ' ') + "x";
  std::string cjk;
  for (int i = 0; i < (1 << 18); ++i) cjk += "\xe5\xa4\xa7";  // U+5927

  const auto t0 = std::chrono::steady_clock::now();
  const auto ids_mixed = tk.encode(mixed);
  const auto ids_word = tk.encode(one_word);
  const auto ids_spaces = tk.encode(spaces);
  const auto ids_cjk = tk.encode(cjk);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  EXPECT_EQ(tk.decode(ids_mixed), nfc(mixed));
  EXPECT_EQ(tk.decode(ids_word), one_word);
  EXPECT_EQ(tk.decode(ids_spaces), spaces);
  EXPECT_EQ(tk.decode(ids_cjk), cjk);
  EXPECT_LT(ids_word.size(), one_word.size() / 4);  // merged, not left as bytes
  // About 5 MB: a linear implementation needs well under a second even on a slow core, about 10 s
  // under ASan on a busy 2-core CI machine; a quadratic one would need hours for the 1 MB word.
  const double limit = kSanitizerBuild ? 60.0 : 10.0;
  EXPECT_LT(secs, limit);
}

}  // namespace
}  // namespace moebatch::test
