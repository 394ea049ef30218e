// A .safetensors file as the loader maps it: the header (JSON: names, dtypes, shapes, offsets)
// must be refused with an Error when it lies about the file, and every tensor it accepts must be
// readable end to end.
#include "common/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moebatch::fuzz::write_input(data, size, ".safetensors");
  try {
    moebatch::fuzz::read_every_tensor(moebatch::SafetensorsFile(path));
  } catch (const moebatch::Error&) {
  }
  return 0;
}
