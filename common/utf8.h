// UTF-8 helpers shared by every module that quotes text from outside in messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace moebatch {

/// Whether `s` is well-formed UTF-8: no overlong forms, no UTF-16 surrogates, nothing past
/// U+10FFFF (what JSON printers and PostgreSQL text accept).
bool is_valid_utf8(std::string_view s);

/// The first `max_bytes` of `s` (all of it if shorter), cut at a character boundary: a quoted
/// excerpt must stay valid UTF-8, since JSON printers refuse a split character.
inline std::string utf8_prefix(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut));
}

/// utf8_prefix for quoting in a message: "…" marks a cut.
inline std::string utf8_excerpt(std::string_view s, std::size_t max_bytes) {
  std::string shown = utf8_prefix(s, max_bytes);
  if (shown.size() < s.size()) shown += "…";
  return shown;
}

}  // namespace moebatch
