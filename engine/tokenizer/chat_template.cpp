#include "engine/tokenizer/chat_template.h"

#include <utility>

#include "common/error.h"

namespace moebatch {

ChatTemplate ChatTemplate::from_source(std::string_view source, ChatSpecialTokens tokens,
                                       const jinja::Limits& limits) {
  try {
    return ChatTemplate(jinja::Template::parse(source, limits), std::move(tokens));
  } catch (const InputError& e) {
    throw InputError(std::string("chat template: ") + e.what());
  }
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options) const {
  return render_json(chat_messages_json(messages), options);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                      const ChatOptions& options) const {
  using jinja::Value;
  try {
    if (!messages.is_array()) throw InputError("messages must be a JSON list");
    if (!options.kwargs.is_object()) throw InputError("chat_template_kwargs must be a JSON object");
    // The keyword arguments transformers hands to jinja2's render(), in its order: later
    // entries win, so kwargs override the special tokens.
    std::vector<std::pair<std::string, Value>> vars;
    vars.emplace_back("messages", Value::from_json(messages));
    vars.emplace_back("tools", options.tools ? Value::from_json(*options.tools) : Value::none());
    vars.emplace_back("documents", Value::none());
    vars.emplace_back("add_generation_prompt", Value::boolean(options.add_generation_prompt));
    if (tokens_.bos_token) vars.emplace_back("bos_token", Value::string(*tokens_.bos_token));
    if (tokens_.eos_token) vars.emplace_back("eos_token", Value::string(*tokens_.eos_token));
    for (const auto& [k, v] : options.kwargs.items()) {
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        throw InputError("chat_template_kwargs: '" + k + "' is set by the request itself");
      }
      vars.emplace_back(k, Value::from_json(v));
    }
    if (options.enable_thinking) {
      vars.emplace_back("enable_thinking", Value::boolean(*options.enable_thinking));
    }
    return tmpl_.render(vars, options.now.value_or(std::chrono::system_clock::now()));
  } catch (const InputError& e) {
    throw InputError(std::string("chat template: ") + e.what());
  }
}

nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
    if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
    if (m.name) j["name"] = *m.name;
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace moebatch
