// Chat rendering: a model's Hugging Face chat template (Jinja source from tokenizer_config.json,
// chat_template.jinja or GGUF metadata) rendered with the variables transformers'
// apply_chat_template passes: messages, tools, documents (none), add_generation_prompt, the
// special tokens and any chat_template_kwargs. The template is parsed once at load, so a broken
// template stops the service at start-up rather than failing every job.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/jinja.h"

namespace moebatch {

/// One chat message as the template sees it.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant" or "tool"
  std::string content;  ///< message text
  /// Assistant reasoning given separately; templates that support it put it in a think block.
  std::optional<std::string> reasoning_content;
  /// Assistant tool calls, OpenAI-style [{"id", "type", "function": {"name", "arguments"}}];
  /// null when there are none (the message then has no tool_calls key).
  nlohmann::ordered_json tool_calls = nullptr;
  std::optional<std::string> tool_call_id = {};  ///< tool messages: the call this answers
  std::optional<std::string> name = {};          ///< optional author name
};

/// The template's variables besides the messages.
struct ChatOptions {
  bool add_generation_prompt = true;    ///< open an assistant turn at the end
  std::optional<bool> enable_thinking;  ///< the `enable_thinking` variable (unset: undefined)
  /// Further top-level variables (chat_template_kwargs), e.g. {"reasoning_effort": "high"};
  /// enable_thinking above, when set, wins over a key of the same name.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  /// Tool definitions for the `tools` variable (a JSON list); unset: tools is none.
  std::optional<nlohmann::ordered_json> tools = {};
  /// What strftime_now() formats (UTC); unset: the clock when rendering.
  std::optional<std::chrono::system_clock::time_point> now = {};
};

/// Special tokens a template may print; an unset one is undefined in the template, as in
/// transformers when tokenizer_config.json has none.
struct ChatSpecialTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

/// A parsed chat template. Copies share the parsed template; render() is thread-safe.
class ChatTemplate {
 public:
  /// Parses `source`; InputError "chat template: line L:C: ..." when it is not valid Jinja.
  static ChatTemplate from_source(std::string_view source, ChatSpecialTokens tokens = {},
                                  const jinja::Limits& limits = {});

  /// Renders `messages`. InputError "chat template: ..." when the template fails or refuses
  /// the conversation (its raise_exception message), or for invalid UTF-8.
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const;

  /// Renders messages given as JSON objects, passed to the template as they are (content may
  /// be null or a list of parts, any extra keys are visible).
  std::string render_json(const nlohmann::ordered_json& messages, const ChatOptions& options) const;

  /// The special tokens this template renders with.
  const ChatSpecialTokens& special_tokens() const { return tokens_; }

 private:
  ChatTemplate(jinja::Template t, ChatSpecialTokens tokens)
      : tmpl_(std::move(t)), tokens_(std::move(tokens)) {}
  jinja::Template tmpl_;
  ChatSpecialTokens tokens_;
};

/// `messages` as the JSON list the template sees: role and content, then reasoning_content,
/// tool_calls, tool_call_id and name when present.
nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages);

}  // namespace moebatch
