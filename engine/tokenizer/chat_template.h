// Chat rendering. tokenizer_config.json ships a Jinja template; rather than embed a Jinja
// engine we recognise known templates by a hash of their exact source and render them with a
// hand-written equivalent. An unrecognised template is refused with an error naming its hash,
// never rendered approximately: a slightly different prompt silently degrades the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch {

/// One chat message as the template sees it.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant" or "tool"
  std::string content;  ///< message text
  /// Assistant reasoning given separately; when absent it is taken from a `<think>` block.
  std::optional<std::string> reasoning_content;
};

/// The template's variables.
struct ChatOptions {
  bool add_generation_prompt = true;    ///< open an assistant turn at the end
  std::optional<bool> enable_thinking;  ///< false: pre-fill an empty think block (unset = true)
};

/// Template families this renderer reproduces.
enum class ChatTemplateKind {
  kQwen3,  ///< Qwen3 ChatML with thinking control (Qwen3 / Qwen3-MoE releases)
};

/// FNV-1a 64-bit hash of a template's source, the key templates are recognised by.
std::uint64_t chat_template_hash(std::string_view source);

/// A recognised chat template.
class ChatTemplate {
 public:
  /// Recognises `source`; InputError naming its hash when it is not a known template.
  static ChatTemplate from_source(std::string_view source);

  /// Renders `messages`; InputError for input the template cannot express (empty list, tool
  /// definitions, an unknown role is rendered as the template does: not at all).
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const;

  /// Which family was recognised.
  ChatTemplateKind kind() const { return kind_; }

 private:
  explicit ChatTemplate(ChatTemplateKind kind) : kind_(kind) {}
  ChatTemplateKind kind_;
};

/// The Qwen3 template, written out (exposed for tests).
std::string render_qwen3_chat(const std::vector<ChatMessage>& messages,
                              const ChatOptions& options);

}  // namespace moebatch
