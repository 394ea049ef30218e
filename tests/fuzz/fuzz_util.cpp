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

}  // namespace moebatch::fuzz
