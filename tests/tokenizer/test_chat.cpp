// The Qwen3 chat template's branches beyond the four reference renderings: reasoning kept
// only after the last real user query, tool responses, and a chat_template.jinja beside the
// config taking precedence (the engine itself: tests/engine/test_jinja.cpp).
#include <gtest/gtest.h>

#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

/// The fixture's Qwen3 template, rendered as the tokenizer renders it.
std::string render_qwen3_chat(const std::vector<ChatMessage>& m, const ChatOptions& opt) {
  const std::string cfg = read_file(qwen3_dir() / "tokenizer_config.json");
  const auto source = nlohmann::json::parse(cfg).at("chat_template").get<std::string>();
  return ChatTemplate::from_source(source).render(m, opt);
}

TEST(ChatTemplate, AnyValidTemplateLoadsAndABrokenOneFailsTheLoad) {
  const std::string tj = tiny_tokenizer_json().dump();
  const Tokenizer tk = Tokenizer::from_json(
      tj, R"({"chat_template": "{% for m in messages %}[{{ m.role }}]{% endfor %}"})");
  EXPECT_EQ(tk.render_chat({{"user", "hi", {}}}), "[user]");
  try {
    Tokenizer::from_json(tj, R"({"chat_template": "{% for m in messages %}"})");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: chat template: line 1:"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, ChatTemplateJinjaFileTakesPrecedence) {
  TempDir dir;
  std::filesystem::copy_file(qwen3_dir() / "tokenizer.json", dir.path() / "tokenizer.json");
  // The config's own template is broken: with the .jinja file beside it, it is never parsed.
  auto cfg = nlohmann::json::parse(read_file(qwen3_dir() / "tokenizer_config.json"));
  cfg["chat_template"] = "{% if %}";
  write_file(dir.path() / "tokenizer_config.json", cfg.dump());
  write_file(dir.path() / "chat_template.jinja", "{{ eos_token }}{{ messages[0].content }}\n");
  const Tokenizer tk = Tokenizer::from_dir(dir.path());
  EXPECT_EQ(tk.render_chat({{"user", "hi", {}}}), "<|im_end|>hi");
}

TEST(ChatTemplate, AssistantThinkingKeptOnlyAfterLastQuery) {
  const std::vector<ChatMessage> m = {
      {"system", "sys", {}},
      {"user", "q1", {}},
      {"assistant", "<think>\nold reasoning\n</think>\n\nold answer", {}},
      {"user", "q2", {}},
      {"assistant", "new answer", std::string("\nnew reasoning\n")},
  };
  ChatOptions opt;
  opt.add_generation_prompt = false;
  EXPECT_EQ(render_qwen3_chat(m, opt),
            "<|im_start|>system\nsys<|im_end|>\n"
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\nold answer<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nnew reasoning\n</think>\n\nnew answer<|im_end|>\n");
}

TEST(ChatTemplate, ToolResponsesAreGroupedIntoOneUserTurn) {
  const std::vector<ChatMessage> m = {
      {"user", "weather?", {}},
      {"assistant", "calling", {}},
      {"tool", "r1", {}},
      {"tool", "r2", {}},
  };
  ChatOptions opt;
  opt.enable_thinking = true;
  EXPECT_EQ(render_qwen3_chat(m, opt),
            "<|im_start|>user\nweather?<|im_end|>\n"
            "<|im_start|>assistant\ncalling<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, LastAssistantTurnGetsThinkBlockEvenWhenEmpty) {
  const std::vector<ChatMessage> m = {{"user", "hi", {}}, {"assistant", "hello", {}}};
  ChatOptions opt;
  opt.add_generation_prompt = false;
  EXPECT_EQ(render_qwen3_chat(m, opt),
            "<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n");
}

TEST(ChatTemplate, EmptyConversationAndInvalidTextAreRefused) {
  const Tokenizer& tk = qwen3();
  EXPECT_THROW(tk.render_chat({}), InputError);
  EXPECT_THROW(tk.render_chat({{"user", "bad \xFF", {}}}), InputError);
}

}  // namespace
}  // namespace moebatch::test
