// Tokenizer::from_gguf: a GGUF file's tokenizer (tokenizer.ggml.*) and chat template, loaded by
// writing the equivalent tokenizer.json / tokenizer_config.json and parsing those — so a GGUF
// model tokenizes with exactly the code (and the checks) of a Hugging Face directory.
#include <nlohmann/json.hpp>

#include "engine/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

// llama.cpp's token types
constexpr int kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

// The pre-tokenizer split of tokenizer.ggml.pre values this engine knows.
std::string split_regex(const std::string& pre, const std::string& path) {
  if (pre == "qwen2") {
    return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
           "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  }
  throw InputError(path + ": tokenizer.ggml.pre '" + pre +
                   "' is not supported (qwen2 is; add its split regex here)");
}

const json& array_of(const GgufModel& m, const std::string& key, size_t n) {
  const json& v = m.require(key);
  if (!v.is_array() || (n && v.size() != n))
    throw InputError(m.path() + ": GGUF metadata '" + key + "' must be an array" +
                     (n ? " of " + std::to_string(n) + " entries" : std::string()));
  return v;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::filesystem::path& path, const TokenizerLimits& limits) {
  const GgufModel m(path);
  const json& kind = m.require("tokenizer.ggml.model");
  if (kind != "gpt2")
    throw InputError(m.path() + ": tokenizer.ggml.model " + kind.dump() +
                     " is not supported (gpt2, i.e. byte-level BPE, is)");
  const json& pre = m.require("tokenizer.ggml.pre");
  const json& tokens = array_of(m, "tokenizer.ggml.tokens", 0);
  if (tokens.size() > limits.max_vocab) throw InputError(m.path() + ": vocabulary too large");
  const json* types = m.metadata().contains("tokenizer.ggml.token_type")
                          ? &array_of(m, "tokenizer.ggml.token_type", tokens.size())
                          : nullptr;
  const json& merges = array_of(m, "tokenizer.ggml.merges", 0);

  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!tokens[id].is_string())
      throw InputError(m.path() + ": token " + std::to_string(id) + " is not a string");
    const int type = types && (*types)[id].is_number_integer() ? (*types)[id].get<int>() : kNormal;
    const std::string& text = tokens[id].get_ref<const std::string&>();
    if (type == kNormal || type == kByte || type == kUnknown) {
      vocab[text] = id;
    } else if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
    } else if (type != kUnused) {
      throw InputError(m.path() + ": token " + std::to_string(id) + " has unknown type " +
                       std::to_string(type));
    }
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  json tok = {{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern",
                    {{"Regex", split_regex(pre.is_string() ? pre.get<std::string>() : pre.dump(),
                                           m.path())}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  byte_level}}}},
              {"decoder", byte_level},
              {"model",
               {{"type", "BPE"},
                {"vocab", std::move(vocab)},
                {"merges", merges},
                {"ignore_merges", false},
                {"byte_fallback", false}}}};

  json cfg = json::object();
  if (auto eos = m.metadata().find("tokenizer.ggml.eos_token_id"); eos != m.metadata().end()) {
    if (!eos->is_number_unsigned() || eos->get<uint64_t>() >= tokens.size())
      throw InputError(m.path() + ": tokenizer.ggml.eos_token_id is not a token id");
    cfg["eos_token"] = tokens[eos->get<size_t>()];
  }
  // The template may print the BOS token (Llama's do); llama.cpp passes it the same way.
  if (auto bos = m.metadata().find("tokenizer.ggml.bos_token_id"); bos != m.metadata().end()) {
    if (!bos->is_number_unsigned() || bos->get<uint64_t>() >= tokens.size())
      throw InputError(m.path() + ": tokenizer.ggml.bos_token_id is not a token id");
    cfg["bos_token"] = tokens[bos->get<size_t>()];
  }
  if (auto t = m.metadata().find("tokenizer.chat_template");
      t != m.metadata().end() && t->is_string())
    cfg["chat_template"] = *t;
  return from_json(tok.dump(), cfg.dump(), limits);
}

Tokenizer Tokenizer::from_model(const std::filesystem::path& path, const TokenizerLimits& limits) {
  return is_gguf_path(path) ? from_gguf(path, limits) : from_dir(path, limits);
}

}  // namespace moebatch
