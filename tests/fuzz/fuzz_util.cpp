#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace moebatch::fuzz {

std::filesystem::path write_input(const uint8_t* data, size_t size, std::string_view suffix) {
  // /dev/shm when present: libFuzzer runs ~10^4 inputs a second and each one is a file here.
  const std::filesystem::path dir =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  const auto path = dir / ("moebatch-fuzz-" + std::to_string(getpid()) + std::string(suffix));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::perror("fuzz: cannot write the input file");
    std::abort();
  }
  return path;
}

}  // namespace moebatch::fuzz
