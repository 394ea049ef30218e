// Hugging Face-compatible byte-level BPE tokenizer (Qwen2/Qwen3, GPT-2/Llama-3 style), loaded
// from a model directory's tokenizer.json (+ tokenizer_config.json for eos and chat template).
//
// encode: cut out added tokens -> NFC each plain segment -> split with the pre-tokenizer regex
//         -> BPE each piece over its raw bytes.
// decode: each id's raw bytes (byte-level alphabet inverted), concatenated, then decoded as
//         UTF-8 with U+FFFD for invalid sequences exactly as Hugging Face does.
//
// A Tokenizer is immutable after loading and safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "engine/tokenizer/chat_template.h"

namespace moebatch {

/// Token id.
using TokenId = std::uint32_t;

/// Size limits applied to outside input.
struct TokenizerLimits {
  std::size_t max_json_bytes = std::size_t{256} << 20;  ///< tokenizer.json / config file size
  std::size_t max_text_bytes = std::size_t{256} << 20;  ///< one encode() input
  std::size_t max_vocab = std::size_t{1} << 24;         ///< largest accepted token id + 1
};

/// A loaded tokenizer.
class Tokenizer {
 public:
  /// Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  static Tokenizer from_dir(const std::filesystem::path& dir, const TokenizerLimits& limits = {});

  /// Loads the tokenizer and chat template a GGUF file carries (tokenizer.ggml.model gpt2:
  /// tokens, token types, merges, eos id, tokenizer.chat_template) through the same code as
  /// tokenizer.json. InputError naming the key for anything missing or unsupported.
  static Tokenizer from_gguf(const std::filesystem::path& path, const TokenizerLimits& limits = {});

  /// Loads a model's tokenizer: from_gguf for a .gguf file, else from_dir.
  static Tokenizer from_model(const std::filesystem::path& path, const TokenizerLimits& limits = {});

  /// Loads from the two files' contents (`config_json` may be empty).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                             const TokenizerLimits& limits = {});

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text` (must be valid UTF-8, else InputError). With `parse_special` false,
  /// special tokens written in the text are tokenized as ordinary text (use for untrusted
  /// user content); non-special added tokens such as `<think>` are always recognised.
  std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;

  /// Text of `ids`; InputError for an unknown id. Invalid UTF-8 byte sequences (possible when
  /// ids split a character) become U+FFFD, as in Hugging Face.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  /// Raw bytes token `id` stands for (may be a partial UTF-8 sequence); InputError if unknown.
  const std::string& token_bytes(TokenId id) const;

  /// Whether `id` is a special added token.
  bool is_special(TokenId id) const;

  /// Id of an added token's content or of a vocabulary entry given as raw text.
  std::optional<TokenId> token_to_id(std::string_view text) const;

  /// Renders a chat with the model's chat template (InputError when there is none, the list
  /// is empty, or the template fails on it: docs/chat_templates.md).
  std::string render_chat(const std::vector<ChatMessage>& messages,
                          const ChatOptions& options = {}) const;

  /// render_chat followed by encode (special tokens parsed: the template inserts them).
  std::vector<TokenId> encode_chat(const std::vector<ChatMessage>& messages,
                                   const ChatOptions& options = {}) const;

  /// Ids that end generation: tokenizer_config's eos_token, then generation_config.json's
  /// eos_token_id entries when that file is present.
  const std::vector<TokenId>& eos_ids() const;

  /// One past the largest id (holes possible).
  std::size_t vocab_size() const;

  /// Limits this tokenizer was loaded with.
  const TokenizerLimits& limits() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
