// Loading tokenizer.json / tokenizer_config.json / generation_config.json. Every field is
// checked for type and range; anything this implementation does not reproduce exactly is
// refused with an error naming the field rather than tokenized differently from Hugging Face.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_parse.h"
#include "common/paths.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace moebatch {
namespace {

using nlohmann::json;

// The GPT-2 split pattern, used when the ByteLevel pre-tokenizer has use_regex=true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void bad(std::string_view file, const std::string& what) {
  throw InputError(std::string(file) + ": " + what);
}

json parse_json(std::string_view text, std::string_view file) {
  std::string problem;
  json j = parse_json_bounded(text, &problem);
  if (!problem.empty()) bad(file, problem);
  return j;
}

/// `j[key]` when present and not null.
const json* field(const json& j, const char* key) {
  const auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

bool flag(const json& j, const char* key, std::string_view ctx) {
  const json* f = field(j, key);
  if (f == nullptr) return false;
  if (!f->is_boolean()) bad("tokenizer.json", std::string(ctx) + "." + key + " must be a boolean");
  return f->get<bool>();
}

std::string type_of(const json& j, std::string_view ctx) {
  if (!j.is_object()) bad("tokenizer.json", std::string(ctx) + " must be an object");
  const json* t = field(j, "type");
  if (t == nullptr || !t->is_string()) bad("tokenizer.json", std::string(ctx) + ".type missing");
  return t->get<std::string>();
}

/// Each step of a "Sequence" (or the single step).
std::vector<const json*> steps(const json& j, const char* list_key, std::string_view ctx) {
  std::vector<const json*> out;
  if (type_of(j, ctx) != "Sequence") {
    out.push_back(&j);
    return out;
  }
  const json* list = field(j, list_key);
  if (list == nullptr || !list->is_array()) {
    bad("tokenizer.json", std::string(ctx) + "." + list_key + " must be an array");
  }
  for (const json& s : *list) out.push_back(&s);
  return out;
}

void load_normalizer(const json& root, Tokenizer::Impl& t) {
  const json* n = field(root, "normalizer");
  if (n == nullptr) return;
  for (const json* s : steps(*n, "normalizers", "normalizer")) {
    const std::string type = type_of(*s, "normalizer");
    if (type != "NFC") bad("tokenizer.json", "normalizer type " + type + " is not supported");
    t.normalizer = tok::Normalizer(tok::Normalizer::Kind::kNfc);
  }
}

void load_pre_tokenizer(const json& root, Tokenizer::Impl& t) {
  const json* p = field(root, "pre_tokenizer");
  if (p == nullptr) bad("tokenizer.json", "pre_tokenizer is missing (byte-level BPE needs one)");
  bool byte_level = false;
  std::optional<std::string> pattern;
  for (const json* s : steps(*p, "pretokenizers", "pre_tokenizer")) {
    const std::string type = type_of(*s, "pre_tokenizer");
    if (type == "Split") {
      const json* pat = field(*s, "pattern");
      const json* re = pat != nullptr && pat->is_object() ? field(*pat, "Regex") : nullptr;
      if (re == nullptr || !re->is_string()) {
        bad("tokenizer.json", "pre_tokenizer Split needs pattern.Regex (a string)");
      }
      const json* behavior = field(*s, "behavior");
      if (behavior == nullptr || *behavior != "Isolated" || flag(*s, "invert", "Split")) {
        bad("tokenizer.json", "pre_tokenizer Split: only behavior Isolated, invert false");
      }
      if (pattern) bad("tokenizer.json", "pre_tokenizer: more than one Split");
      pattern = re->get<std::string>();
    } else if (type == "ByteLevel") {
      if (flag(*s, "add_prefix_space", "ByteLevel")) {
        bad("tokenizer.json", "pre_tokenizer ByteLevel add_prefix_space=true is not supported");
      }
      if (flag(*s, "use_regex", "ByteLevel")) {
        if (pattern) bad("tokenizer.json", "pre_tokenizer: Split and ByteLevel use_regex");
        pattern = std::string(kGpt2Pattern);
      }
      byte_level = true;
    } else {
      bad("tokenizer.json", "pre_tokenizer type " + type + " is not supported");
    }
  }
  if (!byte_level) bad("tokenizer.json", "pre_tokenizer has no ByteLevel step");
  if (!pattern) return;
  try {
    t.splitter.emplace(*pattern);
  } catch (const InputError& e) {
    bad("tokenizer.json", e.what());
  }
}

void check_decoder_and_post(const json& root) {
  const json* d = field(root, "decoder");
  if (d == nullptr) bad("tokenizer.json", "decoder is missing (byte-level BPE needs ByteLevel)");
  for (const json* s : steps(*d, "decoders", "decoder")) {
    const std::string type = type_of(*s, "decoder");
    if (type != "ByteLevel") bad("tokenizer.json", "decoder type " + type + " is not supported");
  }
  const json* pp = field(root, "post_processor");
  if (pp == nullptr) return;
  for (const json* s : steps(*pp, "processors", "post_processor")) {
    const std::string type = type_of(*s, "post_processor");
    if (type != "ByteLevel") {
      bad("tokenizer.json", "post_processor type " + type + " is not supported");
    }
  }
}

/// Vocabulary strings are in the byte-level alphabet; anything else keeps its own bytes.
std::string raw_bytes(const tok::ByteLevelAlphabet& alphabet, const std::string& token) {
  auto bytes = alphabet.to_bytes(token);
  return bytes ? *bytes : token;
}

TokenId checked_id(const json& v, std::size_t max_vocab, const std::string& ctx) {
  if (!v.is_number_integer()) bad("tokenizer.json", ctx + ": id must be an integer");
  const auto id = v.get<std::int64_t>();
  if (id < 0 || static_cast<std::uint64_t>(id) >= max_vocab) {
    bad("tokenizer.json", ctx + ": id " + std::to_string(id) + " out of range [0, " +
                              std::to_string(max_vocab) + ")");
  }
  return static_cast<TokenId>(id);
}

void set_id(Tokenizer::Impl& t, TokenId id, std::string bytes, TokenKind kind) {
  if (id >= t.id_kind.size()) {
    t.id_kind.resize(id + 1, TokenKind::kNone);
    t.id_bytes.resize(id + 1);
  }
  t.id_kind[id] = kind;
  t.id_bytes[id] = std::move(bytes);
}

void load_model(const json& root, const tok::ByteLevelAlphabet& alphabet, Tokenizer::Impl& t) {
  const json* m = field(root, "model");
  if (m == nullptr || !m->is_object()) bad("tokenizer.json", "model is missing");
  const json* type = field(*m, "type");
  if (type != nullptr && *type != "BPE") {
    bad("tokenizer.json", "model type " + type->dump() + " is not supported (BPE only)");
  }
  const json* dropout = field(*m, "dropout");
  if (dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    bad("tokenizer.json", "model.dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* f = field(*m, key);
    if (f != nullptr && !(f->is_string() && f->get<std::string>().empty())) {
      bad("tokenizer.json", std::string("model.") + key + " is not supported");
    }
  }
  if (flag(*m, "byte_fallback", "model")) bad("tokenizer.json", "model.byte_fallback=true");
  t.ignore_merges = flag(*m, "ignore_merges", "model");

  const json* vocab = field(*m, "vocab");
  if (vocab == nullptr || !vocab->is_object()) bad("tokenizer.json", "model.vocab is missing");
  std::unordered_map<std::string, TokenId> by_string;
  by_string.reserve(vocab->size());
  for (const auto& [token, v] : vocab->items()) {
    const TokenId id = checked_id(v, t.limits.max_vocab, "model.vocab[" + token + "]");
    if (id < t.id_kind.size() && t.id_kind[id] != TokenKind::kNone) {
      bad("tokenizer.json", "model.vocab: id " + std::to_string(id) + " used twice");
    }
    std::string bytes = raw_bytes(alphabet, token);
    t.bytes_to_id.emplace(bytes, id);
    set_id(t, id, std::move(bytes), TokenKind::kVocab);
    by_string.emplace(token, id);
  }

  std::array<TokenId, 256> byte_tokens{};
  for (int b = 0; b < 256; ++b) {
    const auto it = by_string.find(alphabet.utf8_of(static_cast<unsigned char>(b)));
    if (it == by_string.end()) {
      bad("tokenizer.json", "model.vocab lacks the byte-level token for byte " + std::to_string(b));
    }
    byte_tokens[b] = it->second;
  }

  const json* merges = field(*m, "merges");
  if (merges == nullptr || !merges->is_array()) bad("tokenizer.json", "model.merges is missing");
  std::vector<tok::MergeRule> rules;
  rules.reserve(merges->size());
  for (std::size_t r = 0; r < merges->size(); ++r) {
    const json& e = (*merges)[r];
    std::string left, right;
    if (e.is_string()) {
      // Legacy "left right" form: vocabulary strings never contain a plain space.
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        bad("tokenizer.json", "model.merges[" + std::to_string(r) + "] is not \"a b\"");
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      bad("tokenizer.json", "model.merges[" + std::to_string(r) + "] is not a pair of strings");
    }
    const auto l = by_string.find(left);
    const auto rr = by_string.find(right);
    const auto res = by_string.find(left + right);
    if (l == by_string.end() || rr == by_string.end() || res == by_string.end()) {
      bad("tokenizer.json", "model.merges[" + std::to_string(r) + "] (" + left + " " + right +
                                ") uses a token missing from model.vocab");
    }
    rules.push_back(tok::MergeRule{l->second, rr->second, res->second});
  }
  t.bpe = std::make_unique<tok::BpeModel>(byte_tokens, rules);
}

void load_added_tokens(const json& root, const tok::ByteLevelAlphabet& alphabet,
                       Tokenizer::Impl& t) {
  std::vector<tok::AddedToken> added;
  const json* list = field(root, "added_tokens");
  if (list != nullptr) {
    if (!list->is_array()) bad("tokenizer.json", "added_tokens must be an array");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& a = (*list)[i];
      const std::string ctx = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object()) bad("tokenizer.json", ctx + " must be an object");
      const json* content = field(a, "content");
      const json* idv = field(a, "id");
      if (content == nullptr || !content->is_string() || content->get<std::string>().empty()) {
        bad("tokenizer.json", ctx + ".content must be a non-empty string");
      }
      if (idv == nullptr) bad("tokenizer.json", ctx + ".id is missing");
      for (const char* key : {"lstrip", "rstrip", "single_word", "normalized"}) {
        if (flag(a, key, ctx)) bad("tokenizer.json", ctx + "." + key + "=true is not supported");
      }
      const TokenId id = checked_id(*idv, t.limits.max_vocab, ctx);
      const bool special = flag(a, "special", ctx);
      const std::string text = content->get<std::string>();
      set_id(t, id, raw_bytes(alphabet, text), special ? TokenKind::kSpecial : TokenKind::kAdded);
      added.push_back(tok::AddedToken{id, text, special});
    }
  }
  t.added = tok::AddedTokenMatcher(std::move(added));
}

/// A token given in a config as "text" or {"content": "text"}.
std::optional<std::string> token_text(const json* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) {
    const json* c = field(*v, "content");
    if (c != nullptr && c->is_string()) return c->get<std::string>();
  }
  throw InputError("tokenizer_config.json: a token must be a string or {\"content\": ...}");
}

/// Parses a chat template at load: a template that is not valid Jinja fails the load.
ChatTemplate load_chat_template(std::string_view source, const Tokenizer::Impl& t,
                                std::string_view origin) {
  try {
    return ChatTemplate::from_source(source, t.chat_tokens);
  } catch (const InputError& e) {
    bad(origin, e.what());
  }
}

void load_config(std::string_view config_json, const Tokenizer& tk, Tokenizer::Impl& t) {
  t.chat_error = "no chat_template: tokenizer_config.json is missing or has none";
  if (config_json.empty()) return;
  const json cfg = parse_json(config_json, "tokenizer_config.json");
  if (!cfg.is_object()) bad("tokenizer_config.json", "must be a JSON object");
  if (auto eos = token_text(field(cfg, "eos_token"))) {
    const auto id = tk.token_to_id(*eos);
    if (!id) bad("tokenizer_config.json", "eos_token " + *eos + " is not a known token");
    t.eos.push_back(*id);
    t.chat_tokens.eos_token = *eos;
  }
  t.chat_tokens.bos_token = token_text(field(cfg, "bos_token"));
  const json* tmpl = field(cfg, "chat_template");
  if (tmpl == nullptr) return;
  std::optional<std::string> source;
  if (tmpl->is_string()) {
    source = tmpl->get<std::string>();
  } else if (tmpl->is_array()) {
    // Named templates: [{"name": "default", "template": "..."}, ...].
    for (const json& e : *tmpl) {
      if (json_string_field(e, "name") == "default" && e.contains("template") &&
          e["template"].is_string()) {
        source = e["template"].get<std::string>();
      }
    }
  }
  if (!source) bad("tokenizer_config.json", "chat_template must be a string or named list");
  t.chat = load_chat_template(*source, t, "tokenizer_config.json");
}

void load_generation_config(const std::filesystem::path& path, Tokenizer::Impl& t) {
  const json g =
      parse_json(read_file_limited(path, t.limits.max_json_bytes), "generation_config.json");
  const json* e = g.is_object() ? field(g, "eos_token_id") : nullptr;
  if (e == nullptr) return;
  const json list = e->is_array() ? *e : json::array({*e});
  for (const json& v : list) {
    const TokenId id = checked_id(v, t.id_kind.size(), "generation_config.json eos_token_id");
    if (std::find(t.eos.begin(), t.eos.end(), id) == t.eos.end()) t.eos.push_back(id);
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const TokenizerLimits& limits) {
  if (tokenizer_json.size() > limits.max_json_bytes || config_json.size() > limits.max_json_bytes) {
    throw InputError("tokenizer.json / tokenizer_config.json over the size limit of " +
                     std::to_string(limits.max_json_bytes) + " bytes");
  }
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  const json root = parse_json(tokenizer_json, "tokenizer.json");
  if (!root.is_object()) bad("tokenizer.json", "must be a JSON object");
  const tok::ByteLevelAlphabet alphabet;
  load_normalizer(root, *impl);
  load_pre_tokenizer(root, *impl);
  check_decoder_and_post(root);
  load_model(root, alphabet, *impl);
  load_added_tokens(root, alphabet, *impl);
  Impl* raw = impl.get();
  Tokenizer tk(std::move(impl));
  load_config(config_json, tk, *raw);
  return tk;
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir, const TokenizerLimits& limits) {
  const auto tok_path = dir / "tokenizer.json";
  if (!std::filesystem::exists(tok_path)) {
    throw InputError(tok_path.string() + ": not found (expected a Hugging Face tokenizer dir)");
  }
  const std::string tok_json = read_file_limited(tok_path, limits.max_json_bytes);
  const auto cfg_path = dir / "tokenizer_config.json";
  std::string cfg_json =
      std::filesystem::exists(cfg_path) ? read_file_limited(cfg_path, limits.max_json_bytes) : "";
  // A chat_template.jinja beside the config takes precedence over its chat_template, as in
  // transformers; the config's then is not parsed at all.
  const auto jinja_path = dir / "chat_template.jinja";
  const bool has_jinja = std::filesystem::exists(jinja_path);
  if (has_jinja && !cfg_json.empty()) {
    json cfg = parse_json(cfg_json, "tokenizer_config.json");
    if (cfg.is_object()) cfg.erase("chat_template");
    cfg_json = cfg.dump();
  }
  Tokenizer tk = from_json(tok_json, cfg_json, limits);
  if (has_jinja) {
    tk.impl_->chat = load_chat_template(read_file_limited(jinja_path, limits.max_json_bytes),
                                        *tk.impl_, jinja_path.string());
  }
  const auto gen_path = dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) load_generation_config(gen_path, *tk.impl_);
  return tk;
}

}  // namespace moebatch
