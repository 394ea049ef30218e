#include "engine/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "common/error.h"

namespace moebatch::tok {
namespace {

/// utf8proc hands back malloc'ed buffers.
struct FreeDeleter {
  void operator()(utf8proc_uint8_t* p) const { std::free(p); }
};

void nfc_piece(std::string_view piece, std::string& out) {
  utf8proc_uint8_t* raw = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(piece.data()),
                   static_cast<utf8proc_ssize_t>(piece.size()), &raw,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owned(raw);
  if (n < 0) {
    throw InputError(std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
  }
  out.append(reinterpret_cast<const char*>(raw), static_cast<std::size_t>(n));
}

}  // namespace

void nfc_append(std::string_view text, std::string& out) {
  // ASCII characters are starters that never combine with what precedes them and never
  // decompose, so a normalization window can end right before any ASCII byte. A window must
  // however start at the ASCII character before a non-ASCII run: "e" + U+0301 composes to "é".
  // Only the non-ASCII runs (with that one leading character) go through utf8proc.
  const std::size_t n = text.size();
  std::size_t copied = 0;
  std::size_t i = 0;
  while (i < n) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t start = (i > copied) ? i - 1 : i;
    std::size_t end = i;
    while (end < n && static_cast<unsigned char>(text[end]) >= 0x80) ++end;
    out.append(text.data() + copied, start - copied);
    nfc_piece(text.substr(start, end - start), out);
    copied = end;
    i = end;
  }
  out.append(text.data() + copied, n - copied);
}

std::string_view Normalizer::apply(std::string_view text, std::string& scratch) const {
  if (kind_ == Kind::kNone) return text;
  bool ascii = true;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return text;
  scratch.clear();
  scratch.reserve(text.size() + text.size() / 8);
  nfc_append(text, scratch);
  return scratch;
}

}  // namespace moebatch::tok
