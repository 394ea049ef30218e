// A .gguf file as the loader maps it: header, metadata key/values (strings, arrays), tensor
// infos and offsets must be refused with an Error when inconsistent with the file, and every
// tensor it accepts must be readable at its first and last element.
#include "common/error.h"
#include "engine/gguf.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = moebatch::fuzz::write_input(data, size, ".gguf");
  try {
    moebatch::GgufFile f(path);
    float sink = 0.f;
    for (const auto& [name, t] : f.tensors()) {
      const int64_t n = t.numel();
      if (n > 0) sink += t.get_f32(0) + t.get_f32(n - 1);
    }
    (void)sink;
  } catch (const moebatch::Error&) {
  }
  return 0;
}
