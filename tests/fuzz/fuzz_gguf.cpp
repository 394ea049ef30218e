// A .gguf file as the loader maps it: header, metadata key/values (strings, arrays), tensor
// infos and offsets must be refused with an Error when inconsistent with the file, and every
// tensor it accepts must be readable at its first and last element.
#include "common/error.h"
#include "engine/gguf.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moebatch::fuzz::write_input(data, size, ".gguf");
  try {
    moebatch::fuzz::read_every_tensor(moebatch::GgufFile(path));
  } catch (const moebatch::Error&) {
  }
  return 0;
}
