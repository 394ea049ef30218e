// Shared helpers for the tokenizer tests: the real Qwen3 tokenizer (loaded once per test
// binary: parsing 11 MB of JSON takes a noticeable fraction of a second) and random text. Paths,
// temp dirs and file reading are the shared harness's (tests/common/files.h).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "tests/common/files.h"

namespace moebatch::test {

/// tests/data/qwen3-tokenizer
std::filesystem::path qwen3_dir();

/// The Qwen3 tokenizer, loaded on first use.
const Tokenizer& qwen3();

/// Random valid UTF-8: ASCII words, digits, whitespace runs, Latin accents (some decomposed),
/// CJK, Hangul, emoji with modifiers and joiners, and other scripts, `n_chunks` pieces long.
std::string random_text(std::mt19937_64& rng, int n_chunks);

/// NFC of a valid UTF-8 string via utf8proc directly (the oracle for round trips).
std::string nfc(const std::string& s);

/// A minimal valid byte-level tokenizer.json: the 256 byte tokens (ids 0..255 in byte order),
/// merges a+b -> "ab" (256), ab+c -> "abc" (257), and the special added token "<|end|>" (258).
nlohmann::json tiny_tokenizer_json();

}  // namespace moebatch::test
