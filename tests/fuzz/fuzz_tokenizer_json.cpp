// tokenizer.json (+ tokenizer_config.json) as Tokenizer::from_json reads it: refused with an
// Error or usable: a tokenizer that loads must encode and decode a fixed text.
#include <string>

#include "common/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const moebatch::Tokenizer t = moebatch::Tokenizer::from_json(moebatch::fuzz::as_text(data, size));
    const auto ids = t.encode("Hello, wörld! 123 <|im_start|>user\n");
    (void)t.decode(ids);
  } catch (const moebatch::Error&) {
  }
  return 0;
}
