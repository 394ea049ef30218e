#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace moebatch::fuzz {

std::filesystem::path scratch_path(std::string_view suffix) {
  const std::filesystem::path dir =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  const auto path = dir / ("moebatch-fuzz-" + std::to_string(getpid()) + std::string(suffix));
  // Every scratch file or directory (an input, a second shard or part, a checkpoint directory)
  // is removed when the process exits normally; a target asks for the same few paths each input.
  static struct Remove {
    std::set<std::filesystem::path> paths;
    ~Remove() {
      std::error_code ec;
      for (const auto& p : paths) std::filesystem::remove_all(p, ec);
    }
  } remove_at_exit;
  remove_at_exit.paths.insert(path);
  return path;
}

std::filesystem::path write_input(const uint8_t* data, size_t size, std::string_view suffix) {
  const auto path = scratch_path(suffix);
  write_file(path, as_text(data, size));
  return path;
}

void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::perror("fuzz: cannot write an input file");
    std::abort();
  }
}

void refused(const char* what, const std::exception& e) {
  if (std::getenv("FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "%s: %s\n", what, e.what());
}

}  // namespace moebatch::fuzz
