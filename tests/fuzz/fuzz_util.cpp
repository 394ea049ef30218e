#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace moebatch::fuzz {

std::filesystem::path scratch_path(std::string_view suffix) {
  const std::filesystem::path dir =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  return dir / ("moebatch-fuzz-" + std::to_string(getpid()) + std::string(suffix));
}

std::filesystem::path write_input(const uint8_t* data, size_t size, std::string_view suffix) {
  const auto path = scratch_path(suffix);
  // Removed when the process exits normally (a target writes under one suffix only).
  static const struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove_at_exit{path};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::perror("fuzz: cannot write the input file");
    std::abort();
  }
  return path;
}

}  // namespace moebatch::fuzz
