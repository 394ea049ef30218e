// The Qwen3 chat template's branches beyond the four reference renderings: reasoning kept
// only after the last real user query, tool responses, and refusal of unknown templates.
#include <gtest/gtest.h>

#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

TEST(ChatTemplate, RecognisesQwen3TemplateByHash) {
  const std::string cfg = read_file(qwen3_dir() / "tokenizer_config.json");
  const auto source = nlohmann::json::parse(cfg).at("chat_template").get<std::string>();
  EXPECT_EQ(ChatTemplate::from_source(source).kind(), ChatTemplateKind::kQwen3);
  EXPECT_THROW(ChatTemplate::from_source(source + " "), InputError);  // any edit: refused
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
