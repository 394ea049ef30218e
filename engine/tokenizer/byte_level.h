// GPT-2 style byte-level alphabet: every byte 0..255 gets a printable code point so that
// vocabulary entries are valid strings. Printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) map to
// themselves; the remaining 68 bytes map, in byte order, to U+0100, U+0101, ...
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace moebatch::tok {

/// The byte <-> code point tables of the byte-level pre-tokenizer and decoder.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  /// Code point that stands for `byte` in vocabulary strings.
  char32_t char_of(unsigned char byte) const { return byte_to_char_[byte]; }

  /// UTF-8 spelling of char_of(byte).
  const std::string& utf8_of(unsigned char byte) const { return byte_to_utf8_[byte]; }

  /// Maps a vocabulary string back to raw bytes; nullopt when it holds a code point outside the
  /// alphabet (Hugging Face then keeps the string's own UTF-8 bytes for that token). The input
  /// must be valid UTF-8.
  std::optional<std::string> to_bytes(std::string_view token) const;

  /// Maps raw bytes to their vocabulary spelling.
  std::string from_bytes(std::string_view bytes) const;

 private:
  std::array<char32_t, 256> byte_to_char_{};
  std::array<std::string, 256> byte_to_utf8_{};
  std::unordered_map<char32_t, unsigned char> char_to_byte_;
};

}  // namespace moebatch::tok
