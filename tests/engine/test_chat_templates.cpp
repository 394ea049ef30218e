// Real model chat templates (tests/data/chat_templates, README there names each source), each
// rendered over a set of conversations and options, byte for byte against Python jinja2 run
// through tests/data/chat_templates/render_chat.py (set up as transformers sets it up). Where
// jinja2 fails, ours must fail too, with the template's own message for raise_exception.
// Skipped only when /usr/bin/python3 has no jinja2.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/tokenizer/chat_template.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"

namespace moebatch::test {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kDate = "2024-07-26";

std::string templates_dir() { return test_data_dir() + "/chat_templates"; }
std::string reference_script() { return templates_dir() + "/render_chat.py"; }

bool python_has_jinja2() {
  return run_command({kPython, "-c", "import jinja2"}, std::chrono::seconds(30)).exit_code == 0;
}

struct Family {
  std::string name;
  std::string source;
  ojson bos;  // string or null (undefined in the template)
  ojson eos;
};

std::vector<Family> families() {
  const std::string bos_ds =
      "<\xef\xbd\x9c"
      "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
  const std::string eos_ds =
      "<\xef\xbd\x9c"
      "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
  std::vector<Family> out = {
      {"qwen2.5", "", nullptr, "<|im_end|>"},
      {"qwq", "", nullptr, "<|im_end|>"},
      {"qwen3-thinking-2507", "", nullptr, "<|im_end|>"},
      {"qwen3-coder", "", nullptr, "<|im_end|>"},
      {"llama3.1", "", "<|begin_of_text|>", "<|eot_id|>"},
      {"llama3.2", "", "<|begin_of_text|>", "<|eot_id|>"},
      {"mistral-nemo", "", "<s>", "</s>"},
      {"deepseek-r1-distill", "", bos_ds, eos_ds},
      {"deepseek-v3.1", "", bos_ds, eos_ds},
      {"glm-4.6", "", nullptr, "<|endoftext|>"},
  };
  for (Family& f : out) f.source = read_file(templates_dir() + "/" + f.name + ".jinja");
  // Qwen3 as shipped in the tokenizer fixture's tokenizer_config.json.
  const auto cfg =
      ojson::parse(read_file(test_data_dir() + "/qwen3-tokenizer/tokenizer_config.json"));
  out.push_back({"qwen3", cfg.at("chat_template").get<std::string>(), nullptr, "<|im_end|>"});
  return out;
}

const char* kTools = R"([
  {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather for a city. Say \"please\" \u2014 caf\u00e9 <ok> & done",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7.5, "default": 3},
        "with-alerts": {"type": "boolean", "nullable": true}},
      "required": ["city"]}}},
  {"type": "function", "function": {
    "name": "search",
    "description": "  Web search.\n Second line.  ",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    "return": {"type": "string"}}}
])";

/// Conversations: plain, multi-turn, reasoning, tool calls and results, odd content.
std::vector<std::pair<std::string, ojson>> conversations() {
  return {
      {"user only", ojson::parse(R"([{"role": "user", "content": "Hello!"}])")},
      {"system and user", ojson::parse(R"([{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "  What is 2+2?  "}])")},
      {"multi-turn", ojson::parse(R"([{"role": "system", "content": "Be kind."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello! How can I help?"},
                        {"role": "user", "content": "Tell me a joke."}])")},
      {"think in content", ojson::parse(R"([{"role": "user", "content": "q1"},
                        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nanswer one"},
                        {"role": "user", "content": "q2"},
                        {"role": "assistant", "content": "<think>new</think>answer two"}])")},
      {"reasoning_content", ojson::parse(R"([{"role": "user", "content": "Why is the sky blue?"},
                        {"role": "assistant", "content": "Rayleigh scattering.",
                         "reasoning_content": "\nShort wavelengths scatter more.\n"},
                        {"role": "user", "content": "And sunsets?"}])")},
      {"tool call and result", ojson::parse(R"([{"role": "system", "content": "Use tools."},
                        {"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"id": "abc123XYZ", "type": "function", "function":
                           {"name": "get_weather", "arguments":
                             {"city": "Paris", "unit": "celsius", "days": 2, "with-alerts": true,
                              "ratio": 0.25, "tags": ["a", "b"], "nested": {"k": null}}}}]},
                        {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather",
                         "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                        {"role": "assistant", "content": "It is 21 \u00b0C and clear."},
                        {"role": "user", "content": "Thanks"}])")},
      {"parallel tool calls, null content",
       ojson::parse(R"([{"role": "user", "content": "Weather in Oslo and Rome"},
                        {"role": "assistant", "content": null,
                         "tool_calls": [
                           {"id": "call00001", "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                           {"id": "call00002", "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                        {"role": "tool", "tool_call_id": "call00001", "content": "-3"},
                        {"role": "tool", "tool_call_id": "call00002", "content": "18"}])")},
      {"string arguments", ojson::parse(R"([{"role": "user", "content": "search cats"},
                        {"role": "assistant", "content": null,
                         "tool_calls": [{"id": "call00003", "type": "function",
                           "function": {"name": "search", "arguments": "{\"q\": \"cats\"}"}}]},
                        {"role": "tool", "tool_call_id": "call00003", "content": "many cats"}])")},
      {"unicode and markup", ojson::parse(R"([{"role": "user",
                         "content": "Caf\u00e9 \u65e5\u672c\u8a9e \ud83d\ude00 {{ not a tag }} {% raw %} <|im_end|>\n\ttab"}])")},
      {"not alternating",
       ojson::parse(R"([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])")},
  };
}

/// Option sets: generation prompt on/off, thinking switches, tools.
struct Options {
  std::string name;
  bool add_generation_prompt;
  ojson kwargs;
  bool tools;
};

std::vector<Options> option_sets() {
  return {
      {"plain", false, ojson::object(), false},
      {"gen", true, ojson::object(), false},
      {"gen, thinking off", true, {{"enable_thinking", false}}, false},
      {"gen, thinking on", true, {{"enable_thinking", true}, {"thinking", true}}, false},
      {"gen, tools", true, ojson::object(), true},
      {"tools, thinking off", false, {{"enable_thinking", false}}, true},
  };
}

struct Rendering {
  std::string label;
  ojson reference;  // {"text"} or {"error", "raised"}
  std::string ours;
  std::string our_error;
};

TEST(ChatTemplates, RealTemplatesRenderAsJinja2) {
  if (!python_has_jinja2())
    GTEST_SKIP() << kPython << " has no jinja2 (apt install python3-jinja2)";
  const ojson tools = ojson::parse(kTools);
  ojson batch = ojson::array();
  std::vector<Rendering> ours;
  std::map<std::string, int> rendered_per_family, refused_per_family;
  for (const Family& f : families()) {
    ChatSpecialTokens tokens;
    if (f.bos.is_string()) tokens.bos_token = f.bos.get<std::string>();
    if (f.eos.is_string()) tokens.eos_token = f.eos.get<std::string>();
    const ChatTemplate tmpl = ChatTemplate::from_source(f.source, tokens);
    for (const auto& [conv_name, messages] : conversations()) {
      for (const Options& o : option_sets()) {
        ojson c = {{"template", f.source},
                   {"messages", messages},
                   {"add_generation_prompt", o.add_generation_prompt},
                   {"bos_token", f.bos},
                   {"eos_token", f.eos},
                   {"kwargs", o.kwargs},
                   {"date", kDate}};
        ChatOptions opt;
        opt.add_generation_prompt = o.add_generation_prompt;
        opt.kwargs = o.kwargs;
        opt.now = std::chrono::sys_days{std::chrono::year{2024} / 7 / 26};
        if (o.tools) {
          c["tools"] = tools;
          opt.tools = tools;
        }
        batch.push_back(std::move(c));
        Rendering r;
        r.label = f.name + " / " + conv_name + " / " + o.name;
        try {
          r.ours = tmpl.render_json(messages, opt);
        } catch (const InputError& e) {
          r.our_error = e.what();
        }
        ours.push_back(std::move(r));
      }
    }
  }
  TempDir dir;
  write_file(dir.file("batch.json"), batch.dump());
  const RunResult py = run_command({kPython, reference_script(), "--batch", dir.file("batch.json")},
                                   std::chrono::seconds(120));
  ASSERT_EQ(py.exit_code, 0) << py.err;
  const ojson ref = ojson::parse(py.out);
  ASSERT_EQ(ref.size(), ours.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    Rendering& r = ours[i];
    SCOPED_TRACE(r.label);
    const ojson& want = ref[i];
    if (want.contains("text")) {
      EXPECT_TRUE(r.our_error.empty()) << "jinja2 renders this; we fail: " << r.our_error;
      EXPECT_EQ(r.ours, want["text"].get<std::string>());
      ++rendered_per_family[r.label.substr(0, r.label.find(' '))];
    } else {
      EXPECT_FALSE(r.our_error.empty()) << "jinja2 fails (" << want["error"] << "), we render:\n"
                                        << r.ours;
      ++refused_per_family[r.label.substr(0, r.label.find(' '))];
      if (want["raised"].get<bool>()) {
        EXPECT_NE(r.our_error.find(want["error"].get<std::string>()), std::string::npos)
            << "ours: " << r.our_error << "\njinja2: " << want["error"];
      }
    }
  }
  // Each family renders most of the grid: the comparison is of renderings, not of errors.
  for (const Family& f : families()) {
    EXPECT_GE(rendered_per_family[f.name], 30) << f.name;
    std::printf("%-20s %3d rendered, %3d refused by both\n", f.name.c_str(),
                rendered_per_family[f.name], refused_per_family[f.name]);
  }
}

TEST(ChatTemplates, CliMatchesTheReferenceScript) {
  if (!python_has_jinja2())
    GTEST_SKIP() << kPython << " has no jinja2 (apt install python3-jinja2)";
  TempDir dir;
  write_file(dir.file("messages.json"),
             R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}])");
  write_file(dir.file("tools.json"), kTools);
  const std::vector<std::string> flags = {"--template",
                                          templates_dir() + "/llama3.2.jinja",
                                          "--messages",
                                          dir.file("messages.json"),
                                          "--tools",
                                          dir.file("tools.json"),
                                          "--add-generation-prompt",
                                          "--bos-token",
                                          "<|begin_of_text|>",
                                          "--kwargs",
                                          R"({"tools_in_user_message": false})",
                                          "--date",
                                          kDate};
  const RunResult ours = run_cli(join_args({{"render-chat"}, flags}));
  const RunResult ref = run_command(join_args({{kPython, reference_script()}, flags}));
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_EQ(ours.out, ref.out);
  EXPECT_NE(ours.out.find("Today Date: 26 Jul 2024"), std::string::npos);

  // raise_exception: exit 2, the template's message on stderr.
  write_file(dir.file("two_users.json"),
             R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  const std::vector<std::string> bad = {"--template", templates_dir() + "/mistral-nemo.jinja",
                                        "--messages", dir.file("two_users.json")};
  const RunResult raised = run_cli(join_args({{"render-chat"}, bad}));
  EXPECT_EQ(raised.exit_code, 2);
  EXPECT_NE(raised.err.find("conversation roles must alternate"), std::string::npos) << raised.err;
  EXPECT_EQ(run_command(join_args({{kPython, reference_script()}, bad})).exit_code, 2);

  // Usage errors exit 2: a missing flag, an unknown one, a bad date.
  EXPECT_EQ(run_cli({"render-chat", "--template", templates_dir() + "/qwq.jinja"}).exit_code, 2);
  EXPECT_EQ(run_cli({"render-chat", "--template", templates_dir() + "/qwq.jinja", "--messages",
                     dir.file("messages.json"), "--no-such-flag"})
                .exit_code,
            2);
  EXPECT_EQ(run_cli({"render-chat", "--template", templates_dir() + "/qwq.jinja", "--messages",
                     dir.file("messages.json"), "--date", "2024-13-01"})
                .exit_code,
            2);
}

}  // namespace
}  // namespace moebatch::test
