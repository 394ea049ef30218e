// CLI command for debugging chat templates:
//   moebatch render-chat --template FILE --messages FILE.json [--tools FILE.json]
//                        [--add-generation-prompt] [--bos-token S] [--eos-token S]
//                        [--kwargs JSON] [--date YYYY-MM-DD]
// Prints the rendering exactly (no newline added), as tests/data/chat_templates/render_chat.py
// prints jinja2's. Any failure, the template's own raise_exception included, is an InputError:
// main() prints it and exits 2. Missing and unknown flags are checked here, not by CLI11, so
// that they exit 2 too.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "common/error.h"
#include "engine/tokenizer/chat_template.h"

namespace moebatch::cli {
namespace {

constexpr std::size_t kMaxFileBytes = std::size_t{64} << 20;

struct RenderChatArgs {
  std::string template_file;
  std::string messages_file;
  std::string tools_file;
  bool add_generation_prompt = false;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::string kwargs;
  std::string date;
};

std::string read_all(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(flag + " " + path + ": cannot read: " + ec.message());
  if (size > kMaxFileBytes) {
    throw InputError(flag + " " + path + ": " + std::to_string(size) +
                     " bytes, over the limit of " + std::to_string(kMaxFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(flag + " " + path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::ordered_json parse_json(const std::string& flag, const std::string& text) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(flag + ": not valid JSON: " + e.what());
  }
}

/// Midnight UTC of a YYYY-MM-DD date.
std::chrono::system_clock::time_point parse_date(const std::string& s) {
  int y = 0;
  unsigned m = 0, d = 0;
  char tail = 0;
  if (s.size() != 10 || std::sscanf(s.c_str(), "%4d-%2u-%2u%c", &y, &m, &d, &tail) != 3) {
    throw InputError("--date: expected YYYY-MM-DD, got '" + s + "'");
  }
  const std::chrono::year_month_day ymd{std::chrono::year{y}, std::chrono::month{m},
                                        std::chrono::day{d}};
  if (!ymd.ok()) throw InputError("--date: " + s + " is not a calendar date");
  return std::chrono::sys_days{ymd};
}

void run_render_chat(const RenderChatArgs& a) {
  if (a.template_file.empty()) throw InputError("render-chat: --template is required");
  if (a.messages_file.empty()) throw InputError("render-chat: --messages is required");
  ChatSpecialTokens tokens{a.bos_token, a.eos_token};
  const ChatTemplate tmpl =
      ChatTemplate::from_source(read_all("--template", a.template_file), std::move(tokens));
  ChatOptions opt;
  opt.add_generation_prompt = a.add_generation_prompt;
  if (!a.tools_file.empty()) opt.tools = parse_json("--tools", read_all("--tools", a.tools_file));
  if (!a.kwargs.empty()) {
    opt.kwargs = parse_json("--kwargs", a.kwargs);
    if (!opt.kwargs.is_object()) throw InputError("--kwargs: expected a JSON object");
  }
  if (!a.date.empty()) opt.now = parse_date(a.date);
  const nlohmann::ordered_json messages =
      parse_json("--messages", read_all("--messages", a.messages_file));
  const std::string text = tmpl.render_json(messages, opt);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void register_chat_commands(CLI::App& app) {
  auto args = std::make_shared<RenderChatArgs>();
  CLI::App* cmd = app.add_subcommand(
      "render-chat", "Render a chat template (Jinja) with messages, as transformers would");
  cmd->add_option("--template", args->template_file, "Jinja chat template file");
  cmd->add_option("--messages", args->messages_file, "JSON list of messages");
  cmd->add_option("--tools", args->tools_file, "JSON list of tool definitions");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "Open an assistant turn at the end");
  cmd->add_option("--bos-token", args->bos_token, "bos_token variable (default: undefined)");
  cmd->add_option("--eos-token", args->eos_token, "eos_token variable (default: undefined)");
  cmd->add_option("--kwargs", args->kwargs,
                  "JSON object of further variables, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--date", args->date, "Date strftime_now() sees, YYYY-MM-DD (default: now, UTC)");
  // Unknown flags are reported by the callback, so that every usage error exits 2.
  cmd->allow_extras();
  cmd->callback([args, cmd] {
    if (!cmd->remaining().empty()) {
      throw InputError("render-chat: unexpected argument '" + cmd->remaining().front() + "'");
    }
    run_render_chat(*args);
  });
}

}  // namespace moebatch::cli
