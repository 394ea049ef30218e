#include "engine/tokenizer/utf8.h"

#include <cstring>

#include "common/error.h"

namespace moebatch::tok {
namespace {

/// Length of the valid sequence starting at s[i], 0 when invalid, or -k when the bytes are a
/// valid but truncated prefix of k bytes running into the end of `s`. The second-byte ranges
/// are the Unicode Table 3-7 ones: they exclude overlongs, surrogates and > U+10FFFF.
int sequence_length(const unsigned char* s, std::size_t n, std::size_t i) {
  const unsigned char b0 = s[i];
  if (b0 < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) return -k;
    const unsigned char b = s[i + k];
    const unsigned char l = (k == 1) ? lo : 0x80;
    const unsigned char h = (k == 1) ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return len;
}

/// Number of bytes of the maximal subpart starting at s[i] (at least 1): the bytes that began a
/// sequence validly before it broke. Rust replaces exactly this span with one U+FFFD.
std::size_t invalid_span(const unsigned char* s, std::size_t n, std::size_t i) {
  const unsigned char b0 = s[i];
  unsigned char lo = 0x80, hi = 0xBF;
  int len = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) len = 3;
  else if (b0 >= 0xF0 && b0 <= 0xF4) len = 4;
  else return 1;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
  std::size_t k = 1;
  for (; k < static_cast<std::size_t>(len) && i + k < n; ++k) {
    const unsigned char b = s[i + k];
    const unsigned char l = (k == 1) ? lo : 0x80;
    const unsigned char h = (k == 1) ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return k;
}

/// Index of the first non-ASCII byte at or after `i`; checks 8 bytes at a time.
std::size_t skip_ascii(const unsigned char* s, std::size_t n, std::size_t i) {
  while (i + 8 <= n) {
    std::uint64_t w;
    std::memcpy(&w, s + i, 8);
    if (w & 0x8080808080808080ULL) break;
    i += 8;
  }
  while (i < n && s[i] < 0x80) ++i;
  return i;
}

}  // namespace

std::size_t utf8_valid_prefix(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const std::size_t n = sv.size();
  std::size_t i = 0;
  while (true) {
    i = skip_ascii(s, n, i);
    if (i >= n) return n;
    const int len = sequence_length(s, n, i);
    if (len <= 0) return i;
    i += static_cast<std::size_t>(len);
  }
}

void utf8_require_valid(std::string_view s, std::string_view what) {
  const std::size_t ok = utf8_valid_prefix(s);
  if (ok != s.size()) {
    throw InputError(std::string(what) + " is not valid UTF-8 (first bad byte at offset " +
                     std::to_string(ok) + " of " + std::to_string(s.size()) + ")");
  }
}

void utf8_append_lossy(std::string_view sv, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const std::size_t n = sv.size();
  std::size_t i = 0;
  while (i < n) {
    const std::size_t start = i;
    i = skip_ascii(s, n, i);
    while (i < n) {
      const int len = sequence_length(s, n, i);
      if (len <= 0) break;
      i += static_cast<std::size_t>(len);
      if (i < n && s[i] < 0x80) break;
    }
    out.append(sv.data() + start, i - start);
    if (i < n && s[i] >= 0x80 && sequence_length(s, n, i) <= 0) {
      i += invalid_span(s, n, i);
      out.append("\xEF\xBF\xBD");
    }
  }
}

std::size_t utf8_incomplete_tail(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const std::size_t n = sv.size();
  // A truncated sequence is at most 3 bytes long; look for its lead byte.
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = s[n - back];
    if (b < 0x80) return 0;
    if (b >= 0xC0) return sequence_length(s, n, n - back) < 0 ? back : 0;
  }
  return 0;
}

void utf8_append_codepoint(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t utf8_next(std::string_view sv, std::size_t& pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const unsigned char b0 = s[pos];
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x3F >> (len - 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (s[pos + k] & 0x3F);
  pos += static_cast<std::size_t>(len);
  return cp;
}

}  // namespace moebatch::tok
