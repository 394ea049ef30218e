#include "engine/tokenizer/tokenizer.h"

#include "common/error.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  if (text.size() > t.limits.max_text_bytes) {
    throw InputError("text to tokenize is " + std::to_string(text.size()) +
                     " bytes, over the limit of " + std::to_string(t.limits.max_text_bytes));
  }
  tok::utf8_require_valid(text, "text to tokenize");

  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  auto encode_piece = [&](std::string_view piece) {
    if (t.ignore_merges) {
      const auto it = t.bytes_to_id.find(std::string(piece));
      if (it != t.bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    t.bpe->encode_piece(piece, out);
  };
  std::string scratch;
  for (const tok::Segment& seg : t.added.split(text, parse_special)) {
    if (seg.is_token) {
      out.push_back(seg.id);
      continue;
    }
    const std::string_view normalized = t.normalizer.apply(seg.text, scratch);
    if (t.splitter) {
      t.splitter->split(normalized, encode_piece);
    } else if (!normalized.empty()) {
      encode_piece(normalized);
    }
  }
  return out;
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  const Impl& t = *impl_;
  if (id >= t.id_kind.size() || t.id_kind[id] == TokenKind::kNone) {
    throw InputError("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                     std::to_string(t.id_kind.size()) + ")");
  }
  return t.id_bytes[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id < impl_->id_kind.size() && impl_->id_kind[id] == TokenKind::kSpecial;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (const TokenId id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special && is_special(id)) continue;
    bytes += b;
  }
  std::string out;
  out.reserve(bytes.size());
  tok::utf8_append_lossy(bytes, out);
  return out;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view text) const {
  for (const tok::AddedToken& a : impl_->added.tokens()) {
    if (a.content == text) return a.id;
  }
  const auto it = impl_->bytes_to_id.find(std::string(text));
  if (it == impl_->bytes_to_id.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::render_chat(const std::vector<ChatMessage>& messages,
                                   const ChatOptions& options) const {
  if (!impl_->chat) throw InputError(impl_->chat_error);
  if (messages.empty()) throw InputError("chat: messages must not be empty");
  for (const ChatMessage& m : messages) {
    tok::utf8_require_valid(m.role, "chat message role");
    tok::utf8_require_valid(m.content, "chat message content");
    if (m.reasoning_content) tok::utf8_require_valid(*m.reasoning_content, "reasoning_content");
  }
  return impl_->chat->render(messages, options);
}

std::vector<TokenId> Tokenizer::encode_chat(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options) const {
  return encode(render_chat(messages, options), true);
}

const std::vector<TokenId>& Tokenizer::eos_ids() const { return impl_->eos; }
std::size_t Tokenizer::vocab_size() const { return impl_->id_kind.size(); }
const TokenizerLimits& Tokenizer::limits() const { return impl_->limits; }

}  // namespace moebatch
