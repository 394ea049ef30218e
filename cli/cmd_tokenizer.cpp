// CLI commands of the tokenizer module:
//   moebatch tokenize   --tokenizer DIR (--text S | --file F) [--json] [--no-special]
//   moebatch detokenize --tokenizer DIR --ids 1,2,3 [--json] [--skip-special]
// Both print to stdout only the result; errors go through main()'s mapping (bad input: exit 2).
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "common/error.h"
#include "common/json_parse.h"
#include "engine/tokenizer/tokenizer.h"

namespace moebatch::cli {
namespace {

struct TokenizeArgs {
  std::string dir;
  std::string text;
  std::string file;
  bool json = false;
  bool no_special = false;
};

struct DetokenizeArgs {
  std::string dir;
  std::string ids;
  bool json = false;
  bool skip_special = false;
};

std::string read_text_file(const std::string& path, std::size_t limit) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError("--file " + path + ": cannot read: " + ec.message());
  if (size > limit) {
    throw InputError("--file " + path + ": " + std::to_string(size) + " bytes, over the limit of " +
                     std::to_string(limit));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--file " + path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Parses "1,2,3" (spaces allowed, optional surrounding brackets) into ids.
std::vector<TokenId> parse_ids(std::string_view s) {
  std::vector<TokenId> ids;
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t' || v.front() == '\n')) {
      v.remove_prefix(1);
    }
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\n')) {
      v.remove_suffix(1);
    }
    return v;
  };
  s = trim(s);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = trim(s.substr(1, s.size() - 2));
  if (s.empty()) return ids;
  while (true) {
    const auto comma = s.find(',');
    const std::string_view item = trim(s.substr(0, comma));
    std::uint32_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      throw InputError("--ids: '" + std::string(item) + "' is not a token id");
    }
    ids.push_back(v);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return ids;
}

void run_tokenize(const TokenizeArgs& a) {
  const Tokenizer tk = Tokenizer::from_dir(a.dir);
  const std::string text =
      a.file.empty() ? a.text : read_text_file(a.file, tk.limits().max_text_bytes);
  const std::vector<TokenId> ids = tk.encode(text, !a.no_special);
  if (a.json) {
    nlohmann::json out = {{"ids", ids}, {"num_tokens", ids.size()}, {"num_bytes", text.size()}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  }
}

void run_detokenize(const DetokenizeArgs& a) {
  const Tokenizer tk = Tokenizer::from_dir(a.dir);
  const std::string text = tk.decode(parse_ids(a.ids), a.skip_special);
  if (a.json) {
    // A decode may end inside a character: printed as U+FFFD, as Hugging Face decodes it.
    std::printf("%s\n", dump_json(nlohmann::json{{"text", text}}).c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  auto tok_args = std::make_shared<TokenizeArgs>();
  CLI::App* tok = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  tok->add_option("--tokenizer", tok_args->dir, "Directory holding tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  auto* text = tok->add_option("--text", tok_args->text, "Text to tokenize (UTF-8)");
  auto* file = tok->add_option("--file", tok_args->file, "File whose contents to tokenize");
  text->excludes(file);
  file->excludes(text);
  tok->add_flag("--json", tok_args->json, "Print {\"ids\", \"num_tokens\", \"num_bytes\"}");
  tok->add_flag("--no-special", tok_args->no_special,
                "Treat special tokens written in the text as plain text");
  tok->callback([tok_args, text, file] {
    if (text->count() == 0 && file->count() == 0) {
      throw InputError("tokenize: give --text or --file");
    }
    run_tokenize(*tok_args);
  });

  auto detok_args = std::make_shared<DetokenizeArgs>();
  CLI::App* detok = app.add_subcommand("detokenize", "Print the text of a list of token ids");
  detok->add_option("--tokenizer", detok_args->dir, "Directory holding tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  detok->add_option("--ids", detok_args->ids, "Comma-separated ids, e.g. 9707,11,1879")->required();
  detok->add_flag("--json", detok_args->json, "Print {\"text\": ...}");
  detok->add_flag("--skip-special", detok_args->skip_special, "Leave special tokens out");
  detok->callback([detok_args] { run_detokenize(*detok_args); });
}

}  // namespace moebatch::cli
