// Python str semantics over UTF-8: indices and lengths count code points, whitespace is
// str.isspace()'s, case mapping is Unicode's (utf8proc's simple mappings). Every input is valid
// UTF-8 (template sources and variables are checked on entry), so no function here re-validates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch::jinja {

/// str.isspace() of one code point.
bool py_isspace(char32_t c);

/// The code points of `s`.
std::u32string utf8_decode(std::string_view s);
/// UTF-8 of code points.
std::string utf8_encode(std::u32string_view s);
/// len(s).
std::size_t py_len(std::string_view s);

/// s.strip(chars) / lstrip / rstrip; chars unset = whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
/// s.split(sep, maxsplit) (from the right when `from_right`); sep unset = runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  std::int64_t maxsplit, bool from_right);
/// s.replace(old, new, count); count < 0 = all. InputError once the result passes max_bytes.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       std::int64_t count, std::size_t max_bytes);
/// s.find(sub, start, end) / rfind in code points; -1 when absent.
std::int64_t py_find(std::string_view s, std::string_view sub, std::optional<std::int64_t> start,
                     std::optional<std::int64_t> end, bool from_right);
/// s.count(sub).
std::int64_t py_count(std::string_view s, std::string_view sub);

/// s.splitlines() (line boundaries as Python's, ends dropped).
std::vector<std::string> py_splitlines(const std::string& s);

/// s.upper(), s.lower().
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
/// s.capitalize(): first code point upper (title) case, the rest lower.
std::string py_capitalize(std::string_view s);
/// s.title(): each run of cased letters starts upper, continues lower.
std::string py_title(std::string_view s);

/// Python's str.isalpha / isdigit / isalnum / islower / isupper / isspace (false when empty).
bool py_is(std::string_view s, std::string_view what);

/// repr() of a str.
std::string py_str_repr(std::string_view s);
/// repr() of a float ("1.0", "1e-05", "inf", "nan").
std::string py_float_repr(double d);

/// The indices a Python slice [start:stop:step] selects from a sequence of `len` items.
std::vector<std::size_t> py_slice_indices(std::size_t len, std::optional<std::int64_t> start,
                                          std::optional<std::int64_t> stop,
                                          std::optional<std::int64_t> step);

/// A run of ASCII digits as a non-negative index; InputError(`out_of_range`) when it does not fit
/// 63 bits (where Python would index with a big int and fail on the length).
std::int64_t parse_digits(std::string_view digits, const char* out_of_range);

}  // namespace moebatch::jinja
