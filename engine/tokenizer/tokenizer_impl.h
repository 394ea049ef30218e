// Internal state of a Tokenizer, shared by the loader (tokenizer_load.cpp) and the encode /
// decode paths (tokenizer.cpp). Not part of the public API.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace moebatch {

/// What an id refers to.
enum class TokenKind : std::uint8_t { kNone, kVocab, kAdded, kSpecial };

struct Tokenizer::Impl {
  TokenizerLimits limits;
  tok::Normalizer normalizer;
  std::optional<tok::RegexSplitter> splitter;  // absent: each segment is one piece
  std::unique_ptr<tok::BpeModel> bpe;
  bool ignore_merges = false;  // a piece that is itself a vocab entry skips the merges
  tok::AddedTokenMatcher added;
  std::vector<std::string> id_bytes;  // [vocab_size] raw bytes per id
  std::vector<TokenKind> id_kind;     // [vocab_size]
  std::unordered_map<std::string, TokenId> bytes_to_id;  // vocab entries by raw bytes
  ChatSpecialTokens chat_tokens;  // bos/eos text from tokenizer_config.json, for the template
  std::optional<ChatTemplate> chat;
  std::string chat_error;  // why `chat` is absent
  std::vector<TokenId> eos;
};

}  // namespace moebatch
