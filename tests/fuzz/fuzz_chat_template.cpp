// A chat template as ChatTemplate reads it (engine/tokenizer/jinja*: lexer, parser, renderer):
// the input up to its first NUL byte is the template source, what follows is the user's message
// text. Parsing refuses with an InputError or yields a template whose rendering of a fixed
// conversation (system, user, assistant with reasoning and a tool call, tool answer) either
// succeeds or refuses with an InputError, within the default Limits.
#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using moebatch::ChatMessage;

std::vector<ChatMessage> conversation(std::string user) {
  nlohmann::ordered_json call = {
      {"id", "call_1"},
      {"type", "function"},
      {"function", {{"name", "lookup"}, {"arguments", R"({"q":"moe"})"}}}};
  std::vector<ChatMessage> m;
  m.push_back({"system", "Be brief.", std::nullopt});
  m.push_back({"user", std::move(user), std::nullopt});
  ChatMessage assistant{"assistant", "", std::string("thinking")};
  assistant.tool_calls = nlohmann::ordered_json::array({call});
  m.push_back(std::move(assistant));
  ChatMessage tool{"tool", R"({"hits":3})", std::nullopt};
  tool.tool_call_id = "call_1";
  m.push_back(std::move(tool));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = moebatch::fuzz::as_text(data, size);
  const size_t nul = std::min(in.find('\0'), in.size());
  const std::string_view source = in.substr(0, nul);
  const std::string user(nul < in.size() ? in.substr(nul + 1) : std::string_view("Hello"));
  try {
    const auto t =
        moebatch::ChatTemplate::from_source(source, moebatch::ChatSpecialTokens{"<s>", "</s>"});
    moebatch::ChatOptions o;
    o.now = std::chrono::system_clock::time_point(std::chrono::seconds(1764547200));
    o.tools = nlohmann::ordered_json::array(
        {{{"type", "function"},
          {"function", {{"name", "lookup"}, {"parameters", {{"type", "object"}}}}}}});
    o.enable_thinking = false;
    const auto messages = conversation(user);
    try {
      (void)t.render(messages, o);
    } catch (const moebatch::InputError&) {
    }
    o.add_generation_prompt = false;
    o.tools.reset();
    o.enable_thinking.reset();
    (void)t.render_json(moebatch::chat_messages_json(messages), o);
  } catch (const moebatch::InputError&) {
  }
  return 0;
}
