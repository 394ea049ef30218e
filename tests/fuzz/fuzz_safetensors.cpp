// A .safetensors file as the loader maps it: the header (JSON: names, dtypes, shapes, offsets)
// must be refused with an Error when it lies about the file, and every tensor it accepts must be
// readable end to end.
#include "common/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moebatch::fuzz::write_input(data, size, ".safetensors");
  try {
    moebatch::SafetensorsFile f(path);
    float sink = 0.f;
    for (const auto& [name, t] : f.tensors()) {
      const int64_t n = t.numel();
      if (n > 0) sink += t.get_f32(0) + t.get_f32(n - 1);  // the first and last bytes it claims
    }
    (void)sink;
  } catch (const moebatch::Error&) {
  }
  return 0;
}
