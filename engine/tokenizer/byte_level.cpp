#include "engine/tokenizer/byte_level.h"

#include "engine/tokenizer/utf8.h"

namespace moebatch::tok {

ByteLevelAlphabet::ByteLevelAlphabet() {
  char32_t next_extra = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
    byte_to_char_[b] = cp;
    utf8_append_codepoint(cp, byte_to_utf8_[b]);
    char_to_byte_.emplace(cp, static_cast<unsigned char>(b));
  }
}

std::optional<std::string> ByteLevelAlphabet::to_bytes(std::string_view token) const {
  std::string out;
  out.reserve(token.size());
  std::size_t pos = 0;
  while (pos < token.size()) {
    const char32_t cp = utf8_next(token, pos);
    const auto it = char_to_byte_.find(cp);
    if (it == char_to_byte_.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

std::string ByteLevelAlphabet::from_bytes(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += byte_to_utf8_[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace moebatch::tok
