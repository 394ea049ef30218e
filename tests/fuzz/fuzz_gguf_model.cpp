// A GGUF model as `serve --model x.gguf` opens it, beyond the one-file parse of fuzz_gguf: the
// model (one file, or a split model of two parts), its ModelConfig from the metadata, and the
// tokenizer and chat template from tokenizer.ggml.* — each must refuse the input with an Error
// or give something usable (an encoding that decodes, a rendered chat).
//
// Input layout: byte 0 even → the rest is one file. Odd → a split model: bytes 1–2 (little
// endian) modulo the remaining length cut the rest into name-00001-of-00002.gguf and
// name-00002-of-00002.gguf (scripts/fuzz_seeds.py writes a seed of each kind).
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/gguf.h"
#include "engine/gguf_source.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// The model's metadata as the engine reads it.
void open_model(const std::filesystem::path& path) {
  try {
    const moebatch::GgufModel model(path);
    // A tensor of the first part and one the engine looks up across parts (the expert stacks
    // may lie in the second): their first and last elements, as fuzz_gguf reads every tensor.
    for (const char* name : {"token_embd.weight", "blk.0.ffn_down_exps.weight", "output.weight"})
      if (const moebatch::TensorView* t = model.find(name); t != nullptr && t->numel() > 0)
        (void)(t->get_f32(0) + t->get_f32(t->numel() - 1));
    (void)moebatch::gguf_model_config(model);
  } catch (const moebatch::Error& e) {
    moebatch::fuzz::refused("model", e);
  }
}

// The tokenizer and template as the service reads them, used on text that has special tokens,
// multi-byte characters and digits in it.
void open_tokenizer(const std::filesystem::path& path) {
  try {
    const auto tok = moebatch::Tokenizer::from_gguf(path);
    const auto ids = tok.encode("Hello, wörld! <|im_start|>user 12345\n\tdone<|im_end|>");
    (void)tok.decode(ids);
    (void)tok.encode("plain text, no specials <|endoftext|>", /*parse_special=*/false);
    try {
      (void)tok.encode_chat({{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi?"}});
    } catch (const moebatch::Error& e) {  // no template, or one that fails on this chat
      moebatch::fuzz::refused("chat", e);
    }
  } catch (const moebatch::Error& e) {
    moebatch::fuzz::refused("tokenizer", e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  std::filesystem::path first;
  if ((data[0] & 1) == 0) {
    first = moebatch::fuzz::write_input(data + 1, size - 1, ".gguf");
  } else {
    const size_t rest = size - 3;
    const size_t cut = rest == 0 ? 0 : (data[1] | size_t{data[2]} << 8) % rest;
    first = moebatch::fuzz::scratch_path("-00001-of-00002.gguf");
    const std::string_view parts = moebatch::fuzz::as_text(data + 3, rest);
    moebatch::fuzz::write_file(first, parts.substr(0, cut));
    moebatch::fuzz::write_file(moebatch::fuzz::scratch_path("-00002-of-00002.gguf"), parts.substr(cut));
  }
  open_model(first);
  open_tokenizer(first);
  return 0;
}
