#include "engine/tokenizer/jinja_strings.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch::jinja {
namespace {

using tok::utf8_append_codepoint;
using tok::utf8_next;

bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

char32_t to_upper(char32_t c) { return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)); }
char32_t to_lower(char32_t c) { return utf8proc_tolower(static_cast<utf8proc_int32_t>(c)); }
char32_t to_title(char32_t c) { return utf8proc_totitle(static_cast<utf8proc_int32_t>(c)); }

template <typename F>
std::string map_codepoints(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) utf8_append_codepoint(f(utf8_next(s, i)), out);
  return out;
}

/// Byte offset of code point index `cp` (clamped to the end).
std::size_t byte_offset(std::string_view s, std::size_t cp) {
  std::size_t i = 0;
  for (std::size_t n = 0; n < cp && i < s.size(); ++n) utf8_next(s, i);
  return i;
}

/// Python's start/end clamping of str.find's optional bounds.
std::size_t clamp_index(std::optional<std::int64_t> v, std::size_t len, std::size_t dflt) {
  if (!v) return dflt;
  std::int64_t x = *v;
  if (x < 0) x += static_cast<std::int64_t>(len);
  if (x < 0) return 0;
  return std::min<std::size_t>(static_cast<std::size_t>(x), len);
}

}  // namespace

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) out.push_back(utf8_next(s, i));
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) utf8_append_codepoint(c, out);
  return out;
}

std::size_t py_len(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  const std::u32string u = utf8_decode(s);
  std::size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep && sep->empty()) throw InputError("empty separator");
  if (sep) {
    if (!from_right) {
      std::size_t pos = 0;
      while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
        const std::size_t p = s.find(*sep, pos);
        if (p == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, p - pos));
        pos = p + sep->size();
      }
      out.emplace_back(s.substr(pos));
      return out;
    }
    std::size_t end = s.size();
    while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const std::size_t p = s.rfind(*sep, end - sep->size());
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Runs of whitespace; the unsplit remainder keeps the whitespace at its far end.
  std::u32string u = utf8_decode(s);
  if (from_right) std::reverse(u.begin(), u.end());
  std::size_t i = 0;
  while (true) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
      std::u32string rest = u.substr(i);
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(utf8_encode(rest));
      break;
    }
    std::size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    std::u32string word = u.substr(i, j - i);
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(utf8_encode(word));
    i = j;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       std::int64_t count, std::size_t max_bytes) {
  std::string out;
  std::int64_t done = 0;
  auto check = [&] {
    if (out.size() > max_bytes) {
      throw InputError("replace() result exceeds " + std::to_string(max_bytes) + " bytes");
    }
  };
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    std::size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
        check();
      }
      if (i == s.size()) break;
      const std::size_t start = i;
      utf8_next(s, i);
      out += s.substr(start, i - start);
    }
    return out;
  }
  std::size_t pos = 0;
  while (count < 0 || done < count) {
    const std::size_t p = s.find(from, pos);
    if (p == std::string_view::npos) break;
    out += s.substr(pos, p - pos);
    out += to;
    pos = p + from.size();
    ++done;
    check();
  }
  out += s.substr(pos);
  return out;
}

std::int64_t py_find(std::string_view s, std::string_view sub, std::optional<std::int64_t> start,
                     std::optional<std::int64_t> end, bool from_right) {
  const std::size_t len = py_len(s);
  const std::size_t b = clamp_index(start, len, 0);
  const std::size_t e = clamp_index(end, len, len);
  if (b > e || (start && *start > static_cast<std::int64_t>(len))) return -1;
  const std::size_t bb = byte_offset(s, b);
  const std::size_t eb = byte_offset(s, e);
  const std::string_view window = s.substr(bb, eb - bb);
  const std::size_t p = from_right ? window.rfind(sub) : window.find(sub);
  if (p == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(b + py_len(window.substr(0, p)));
}

std::int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<std::int64_t>(py_len(s)) + 1;
  std::int64_t n = 0;
  for (std::size_t p = s.find(sub); p != std::string_view::npos; p = s.find(sub, p + sub.size())) {
    ++n;
  }
  return n;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  const std::u32string u = utf8_decode(s);
  std::size_t start = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    const bool brk = c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.push_back(utf8_encode(std::u32string_view(u).substr(start, i - start)));
    if (c == U'\r' && i + 1 < u.size() && u[i + 1] == U'\n') ++i;
    start = i + 1;
  }
  if (start < u.size()) out.push_back(utf8_encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string py_upper(std::string_view s) { return map_codepoints(s, to_upper); }
std::string py_lower(std::string_view s) { return map_codepoints(s, to_lower); }

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_codepoints(s, [&](char32_t c) {
    const char32_t r = first ? to_title(c) : to_lower(c);
    first = false;
    return r;
  });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_codepoints(s, [&](char32_t c) {
    const char32_t r = prev_cased ? to_lower(c) : to_title(c);
    prev_cased = is_cased(c);
    return r;
  });
}

bool py_is(std::string_view s, std::string_view what) {
  if (s.empty()) return false;
  bool any_cased = false;
  for (std::size_t i = 0; i < s.size();) {
    const char32_t c = utf8_next(s, i);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    const bool digit = cat == UTF8PROC_CATEGORY_ND;
    if (what == "isalpha" && !alpha) return false;
    if (what == "isdigit" && !digit) return false;
    if (what == "isalnum" && !alpha && !digit && cat != UTF8PROC_CATEGORY_NL &&
        cat != UTF8PROC_CATEGORY_NO) {
      return false;
    }
    if (what == "isspace" && !py_isspace(c)) return false;
    if (what == "islower" || what == "isupper") {
      if (cat == UTF8PROC_CATEGORY_LT) return false;
      if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL) {
        any_cased = true;
        if ((what == "islower") != (cat == UTF8PROC_CATEGORY_LL)) return false;
      }
    }
  }
  return (what == "islower" || what == "isupper") ? any_cased : true;
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t start = i;
    const char32_t c = utf8_next(s, i);
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c == U'\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                               cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                               cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                               cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
      if (printable) {
        out += s.substr(start, i - start);
      } else {
        const char* fmt = c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x";
        std::snprintf(buf, sizeof buf, fmt, static_cast<unsigned>(c));
        out += buf;
      }
    }
  }
  out += quote;
  return out;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for 1e-4 <= |d| < 1e16.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  const std::size_t epos = sci.find('e');
  std::string_view mant = sci.substr(0, epos);
  int exp = 0;
  std::from_chars(sci.data() + epos + 1 + (sci[epos + 1] == '+'), sci.data() + sci.size(), exp);
  std::string out;
  if (!mant.empty() && mant.front() == '-') {
    out += '-';
    mant.remove_prefix(1);
  }
  std::string digits;
  for (const char c : mant) {
    if (c != '.') digits += c;
  }
  if (exp >= -4 && exp < 16) {
    const int decpt = exp + 1;  // digits before the decimal point
    const int n = static_cast<int>(digits.size());
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(static_cast<std::size_t>(decpt - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
             digits.substr(static_cast<std::size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + buf;
}

std::vector<std::size_t> py_slice_indices(std::size_t len, std::optional<std::int64_t> start,
                                          std::optional<std::int64_t> stop,
                                          std::optional<std::int64_t> step) {
  const std::int64_t st = step.value_or(1);
  if (st == 0) throw InputError("slice step cannot be zero");
  const auto n = static_cast<std::int64_t>(len);
  const std::int64_t lower = st > 0 ? 0 : -1;
  const std::int64_t upper = st > 0 ? n : n - 1;
  auto fix = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const std::int64_t b = fix(start, st > 0 ? lower : upper);
  const std::int64_t e = fix(stop, st > 0 ? upper : lower);
  std::vector<std::size_t> out;
  for (std::int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    out.push_back(static_cast<std::size_t>(i));
  }
  return out;
}

std::int64_t parse_digits(std::string_view digits, const char* out_of_range) {
  std::int64_t v = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || v < 0) throw InputError(out_of_range);
  return v;
}

}  // namespace moebatch::jinja
