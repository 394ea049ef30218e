// Where the tests find their inputs, and scratch space: the fixture and source directories, a
// temporary directory removed at scope exit, whole-file read and write.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moebatch::test {

/// tests/data: the checkpoint fixtures and the Qwen3 tokenizer (MOEBATCH_TEST_DATA).
inline std::string test_data_dir() { return MOEBATCH_TEST_DATA; }

/// The project's source root (MOEBATCH_SOURCE_DIR), for documents the tests hold the code to.
inline std::string source_dir() { return MOEBATCH_SOURCE_DIR; }

/// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "moebatch-test-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed for " + t);
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The directory.
  const std::filesystem::path& path() const { return path_; }
  /// path() / name as a string, for APIs and argv that take strings.
  std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// The whole file; empty when it cannot be opened (e.g. a log not written yet).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Writes bytes to p, replacing it; throws when it cannot be written.
inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace moebatch::test
