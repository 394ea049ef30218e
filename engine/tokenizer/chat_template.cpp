#include "engine/tokenizer/chat_template.h"

#include <cstdio>

#include "common/error.h"

namespace moebatch {
namespace {

/// Known templates: hash of the exact Jinja source -> family. Add a row only after checking
/// the renderer against reference renderings of that source.
struct KnownTemplate {
  std::uint64_t hash;
  ChatTemplateKind kind;
  const char* name;
};
constexpr KnownTemplate kKnownTemplates[] = {
    {0x2bfdb7aa9754484eULL, ChatTemplateKind::kQwen3, "Qwen3 (thinking switch)"},
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n'): only newline characters.
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const auto p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const auto p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

}  // namespace

std::uint64_t chat_template_hash(std::string_view source) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : source) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

ChatTemplate ChatTemplate::from_source(std::string_view source) {
  const std::uint64_t h = chat_template_hash(source);
  for (const auto& known : kKnownTemplates) {
    if (known.hash == h) return ChatTemplate(known.kind);
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  throw InputError(std::string("chat_template in tokenizer_config.json is not a supported "
                               "template (fnv1a64 ") +
                   hex + ", " + std::to_string(source.size()) +
                   " bytes); supported: Qwen3 ChatML");
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options) const {
  switch (kind_) {
    case ChatTemplateKind::kQwen3:
      return render_qwen3_chat(messages, options);
  }
  throw Error("chat template: unhandled template kind");
}

// Mirrors the Jinja source branch by branch (the `tools` branch is refused by the API: this
// renderer has no tool definitions to print).
std::string render_qwen3_chat(const std::vector<ChatMessage>& messages,
                              const ChatOptions& options) {
  if (messages.empty()) throw InputError("chat: messages must not be empty");
  const std::size_t n = messages.size();
  std::string out;
  if (messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }

  // The last user turn that is a real query, not a wrapped tool response: assistant turns after
  // it keep their reasoning, earlier ones drop it.
  bool multi_step_tool = true;
  std::size_t last_query_index = n - 1;
  for (std::size_t k = n; k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (multi_step_tool && m.role == "user" &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      multi_step_tool = false;
      last_query_index = k;
    }
  }

  for (std::size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool first = i == 0;
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && !first)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content.has_value()) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        const std::string_view whole = m.content;
        content = lstrip_nl(after_last(whole, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(whole, "</think>")), "<think>"));
      }
      if (i > last_query_index && (last || !reasoning.empty())) {
        out += "<|im_start|>" + m.role + "\n<think>\n";
        out += lstrip_nl(rstrip_nl(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_nl(content);
      } else {
        out += "<|im_start|>" + m.role + "\n";
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (first || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

}  // namespace moebatch
