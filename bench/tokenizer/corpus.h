// Deterministic benchmark text: English prose, Chinese prose and source code, built from fixed
// word lists with a seeded generator so every run (and the peer script) sees identical bytes.
#pragma once

#include <cstddef>
#include <string>

namespace moebatch::bench {

/// About `bytes` of English sentences (mixed case, punctuation, numbers).
std::string english_text(std::size_t bytes, unsigned seed);

/// About `bytes` of Chinese sentences with full-width punctuation and some Latin/digits.
std::string chinese_text(std::size_t bytes, unsigned seed);

/// About `bytes` of C++ and Python-like code with indentation and comments.
std::string code_text(std::size_t bytes, unsigned seed);

/// Random code points from many scripts with combining marks, emoji sequences, digits and
/// unusual whitespace (U+0085, U+00A0, U+180E, U+3000, CR LF): a parity probe, not prose.
std::string unicode_text(std::size_t bytes, unsigned seed);

/// Paragraphs of the three kinds interleaved, drawn 4:3:3 (English : Chinese : code).
std::string mixed_text(std::size_t bytes, unsigned seed);

}  // namespace moebatch::bench
