// Helpers shared by the libFuzzer targets (tests/fuzz, scripts/fuzz.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

namespace moebatch::fuzz {

/// Writes one input to this process's scratch file (the parsers under test map files) and
/// returns its path; every call overwrites the previous input.
std::filesystem::path write_input(const uint8_t* data, size_t size, std::string_view suffix);

/// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace moebatch::fuzz
