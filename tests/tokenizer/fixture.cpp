#include "tests/tokenizer/fixture.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "engine/tokenizer/utf8.h"

namespace moebatch::test {

std::filesystem::path qwen3_dir() {
  return std::filesystem::path(test_data_dir()) / "qwen3-tokenizer";
}

const Tokenizer& qwen3() {
  static const Tokenizer tk = Tokenizer::from_dir(qwen3_dir());
  return tk;
}

nlohmann::json tiny_tokenizer_json() {
  // Byte-level spelling of each byte, same rule as the loader's alphabet.
  nlohmann::json vocab = nlohmann::json::object();
  char32_t extra = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string s;
    tok::utf8_append_codepoint(printable ? static_cast<char32_t>(b) : extra++, s);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return {
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"(\p{L}+|\p{N}|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor", nullptr},
      {"added_tokens",
       {{{"id", 258}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({nlohmann::json::array({"a", "b"}),
                                               nlohmann::json::array({"ab", "c"})})}}}};
}

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<const char*>(out));
  std::free(out);
  return r;
}

std::string random_text(std::mt19937_64& rng, int n_chunks) {
  static const std::vector<std::string> words = {
      "the", "Hello", "world", "MoE", "GPU", "don't", "it's", "WE'LL", "x", "_init_", "foo.bar",
      "naïve", "café", "Ünïcödé", "straße", "Ελλάδα", "Москва", "東京", "मराठी", "عربى"};
  static const std::vector<std::string> spaces = {" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n",
                                                  "   \t", "\u3000", "\u00a0", " \u2003 "};
  std::string out;
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  for (int c = 0; c < n_chunks; ++c) {
    switch (pick(9)) {
      case 0:
        out += words[pick(words.size())];
        break;
      case 1:
        out += spaces[pick(spaces.size())];
        break;
      case 2:
        for (std::size_t k = 0, n = 1 + pick(12); k < n; ++k) out += char('0' + pick(10));
        break;
      case 3:  // CJK unified ideographs
        for (std::size_t k = 0, n = 1 + pick(8); k < n; ++k) {
          tok::utf8_append_codepoint(static_cast<char32_t>(0x4E00 + pick(0x5000)), out);
        }
        break;
      case 4:  // Hangul syllables and kana
        for (std::size_t k = 0, n = 1 + pick(6); k < n; ++k) {
          tok::utf8_append_codepoint(
              static_cast<char32_t>(pick(2) ? 0xAC00 + pick(11172) : 0x3041 + pick(0x5D)), out);
        }
        break;
      case 5: {  // emoji, skin tones, ZWJ sequences, flags
        static const char32_t emoji[] = {0x1F600, 0x1F44D, 0x1F3FD, 0x200D, 0x1F469, 0x2764,
                                         0xFE0F,  0x1F1E8, 0x1F1F3, 0x1F680, 0x2728};
        for (std::size_t k = 0, n = 1 + pick(4); k < n; ++k) {
          tok::utf8_append_codepoint(emoji[pick(std::size(emoji))], out);
        }
        break;
      }
      case 6: {  // base letter + combining marks (decomposed: NFC changes them)
        out += char('a' + pick(26));
        static const char32_t marks[] = {0x0301, 0x0300, 0x0308, 0x0327, 0x0323, 0x030A};
        for (std::size_t k = 0, n = 1 + pick(3); k < n; ++k) {
          tok::utf8_append_codepoint(marks[pick(std::size(marks))], out);
        }
        break;
      }
      case 7: {  // punctuation and code-ish symbols
        static const std::string punct = "!?.,;:'\"()[]{}<>|/\\#@$%^&*-+=~`_";
        for (std::size_t k = 0, n = 1 + pick(5); k < n; ++k) out += punct[pick(punct.size())];
        break;
      }
      default: {  // any scalar value from the BMP or the supplementary planes
        char32_t cp = 0;
        do {
          cp = static_cast<char32_t>(pick(2) ? 0x20 + pick(0xFFE0) : 0x10000 + pick(0x30000));
        } while (cp >= 0xD800 && cp <= 0xDFFF);
        tok::utf8_append_codepoint(cp, out);
        break;
      }
    }
  }
  return out;
}

}  // namespace moebatch::test
