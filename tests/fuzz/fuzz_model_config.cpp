// config.json as parse_model_config reads it: any JSON document is either a valid, consistent
// ModelConfig or an InputError naming the field.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Not JSON at all is the reader's concern (covered by the loader tests); fuzz the fields.
  const auto j = nlohmann::json::parse(moebatch::fuzz::as_text(data, size), nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const moebatch::ModelConfig c = moebatch::parse_model_config(j, "fuzz");
    // A config that parses must describe a model the shapes agree with.
    if (c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0) __builtin_trap();
    (void)c.state_bytes_per_seq();
  } catch (const moebatch::Error&) {
  }
  return 0;
}
