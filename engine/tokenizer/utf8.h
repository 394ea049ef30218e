// UTF-8 helpers shared by the tokenizer: validation with the offending offset, Rust-compatible
// lossy decoding (Hugging Face decodes bytes with String::from_utf8_lossy, so replacement must
// follow the same "maximal subpart" rule to reproduce its output), and the streaming boundary
// test used by the incremental decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moebatch::tok {

/// Length in bytes of the longest valid UTF-8 prefix of `s` (== s.size() when all valid).
std::size_t utf8_valid_prefix(std::string_view s);

/// Throws InputError naming `what` and the byte offset when `s` is not valid UTF-8.
void utf8_require_valid(std::string_view s, std::string_view what);

/// Appends `s` to `out`, replacing each maximal invalid subpart with U+FFFD (as Rust's
/// String::from_utf8_lossy). `s` must not end inside a truncated sequence unless `final`.
void utf8_append_lossy(std::string_view s, std::string& out);

/// Number of trailing bytes of `s` that form an incomplete but so-far valid sequence (0..3):
/// a streaming decoder must hold them back until the next bytes arrive.
std::size_t utf8_incomplete_tail(std::string_view s);

/// Appends the UTF-8 encoding of code point `cp` (must be a scalar value) to `out`.
void utf8_append_codepoint(char32_t cp, std::string& out);

/// Decodes one code point at `s[pos]` of a string already known to be valid; advances `pos`.
char32_t utf8_next(std::string_view s, std::size_t& pos);

}  // namespace moebatch::tok
