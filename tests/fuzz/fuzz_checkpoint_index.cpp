// A sharded Hugging Face checkpoint as `Checkpoint` opens it: model.safetensors.index.json and
// the shards its weight_map names. Every refusal must be an Error, and an accepted checkpoint's
// tensors (each name the index lists that the checkpoint holds) read at both ends.
//
// Input layout: the index JSON, a NUL, two bytes (little endian) that cut the rest, modulo its
// length, into shard-00001.safetensors and shard-00002.safetensors (scripts/fuzz_seeds.py).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = moebatch::fuzz::as_text(data, size);
  const size_t nul = in.find('\0');
  if (nul == std::string_view::npos || size - nul < 3) return 0;
  const std::string_view index = in.substr(0, nul);
  const std::string_view shards = in.substr(nul + 3);
  const size_t cut = shards.empty() ? 0 : (data[nul + 1] | size_t{data[nul + 2]} << 8) % shards.size();

  // A fresh directory per process, its files overwritten by each input (a shard the index no
  // longer names stays behind, unread).
  static const std::filesystem::path dir = [] {
    auto d = moebatch::fuzz::scratch_path(".ckpt");
    std::filesystem::create_directories(d);
    return d;
  }();
  moebatch::fuzz::write_file(dir / "model.safetensors.index.json", index);
  moebatch::fuzz::write_file(dir / "shard-00001.safetensors", shards.substr(0, cut));
  moebatch::fuzz::write_file(dir / "shard-00002.safetensors", shards.substr(cut));

  try {
    const moebatch::Checkpoint ckpt(dir);
    const auto j = nlohmann::json::parse(index, nullptr, /*allow_exceptions=*/false);
    float sink = 0.f;
    if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!ckpt.has(name)) continue;  // listed in the index, held by no shard
        const moebatch::TensorView& t = ckpt.at(name);
        if (t.numel() > 0) sink += t.get_f32(0) + t.get_f32(t.numel() - 1);
      }
    }
    static_cast<void>(sink);
  } catch (const moebatch::Error& e) {
    moebatch::fuzz::refused("checkpoint", e);
  }
  return 0;
}
