// Helpers shared by the libFuzzer targets (tests/fuzz, scripts/fuzz.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string_view>

namespace moebatch::fuzz {

/// This process's scratch path with `suffix` appended: in /dev/shm when present (libFuzzer runs
/// ~10^4 inputs a second and each one may touch a file there), else the temp directory. Removed
/// (with what is under it) when the process exits normally.
std::filesystem::path scratch_path(std::string_view suffix);

/// Writes one input to this process's scratch file (the parsers under test map files) and
/// returns its path; every call overwrites the previous input.
std::filesystem::path write_input(const uint8_t* data, size_t size, std::string_view suffix);

/// Says why an input was refused when FUZZ_VERBOSE is set (to check that the seeds load whole);
/// silent otherwise.
void refused(const char* what, const std::exception& e);

/// Writes `bytes` to `path` (a target's second file: a shard, a split part); aborts when it
/// cannot, as write_input does.
void write_file(const std::filesystem::path& path, std::string_view bytes);

/// Reads the first and last element of every tensor a parsed file accepted (the bytes its
/// header claims: out-of-file offsets show up here under ASan).
template <class File>
void read_every_tensor(const File& f) {
  float sink = 0.f;
  for (const auto& [name, t] : f.tensors()) {
    const int64_t n = t.numel();
    if (n > 0) sink += t.get_f32(0) + t.get_f32(n - 1);
  }
  static_cast<void>(sink);
}

/// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace moebatch::fuzz
