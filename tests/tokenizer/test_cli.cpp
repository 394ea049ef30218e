// The tokenize / detokenize commands, run as the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

struct CliRun {
  int code;
  std::string out;
};

/// Runs the CLI with `args` (already shell-quoted); stdout captured, stderr dropped.
CliRun run_cli(const std::string& args) {
  const std::string cmd = std::string("'") + MOEBATCH_BIN + "' " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string dir_arg() { return "--tokenizer '" + qwen3_dir().string() + "'"; }

TEST(TokenizerCli, TokenizePrintsIdsAsJsonArray) {
  const CliRun r = run_cli("tokenize " + dir_arg() + " --text 'Hello, world!'");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "[9707,11,1879,0]\n");
  const CliRun j = run_cli("tokenize " + dir_arg() + " --text 'Hello, world!' --json");
  EXPECT_EQ(j.code, 0);
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed.at("ids"), nlohmann::json({9707, 11, 1879, 0}));
  EXPECT_EQ(parsed.at("num_tokens"), 4);
}

TEST(TokenizerCli, TokenizeFileMatchesLibrary) {
  const std::string path = testing::TempDir() + "tok_cli_input.txt";
  const std::string text = "中文测试：大模型\n<|im_start|>user\ndef f(x): return x\n";
  std::ofstream(path, std::ios::binary) << text;
  const CliRun r = run_cli("tokenize " + dir_arg() + " --file '" + path + "'");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out).get<std::vector<TokenId>>(), qwen3().encode(text));
}

TEST(TokenizerCli, DetokenizePrintsText) {
  const CliRun r = run_cli("detokenize " + dir_arg() + " --ids 9707,11,1879,0");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "Hello, world!");
  const CliRun s = run_cli("detokenize " + dir_arg() + " --ids '151644, 872' --json");
  EXPECT_EQ(nlohmann::json::parse(s.out).at("text"), "<|im_start|>user");
}

TEST(TokenizerCli, BadInputExitsWithCode2) {
  EXPECT_EQ(run_cli("detokenize " + dir_arg() + " --ids 1,x,3").code, 2);
  EXPECT_EQ(run_cli("detokenize " + dir_arg() + " --ids 99999999").code, 2);
  const std::string bad_file = testing::TempDir() + "tok_cli_bad.txt";
  std::ofstream(bad_file, std::ios::binary) << "bad \xff";
  EXPECT_EQ(run_cli("tokenize " + dir_arg() + " --file '" + bad_file + "'").code, 2);
  EXPECT_EQ(run_cli("tokenize " + dir_arg()).code, 2);  // neither --text nor --file
  EXPECT_EQ(run_cli("tokenize --tokenizer /tmp --text hi").code, 2);  // no tokenizer.json
  EXPECT_NE(run_cli("tokenize " + dir_arg() + " --text a --file b").code, 0);
}

}  // namespace
}  // namespace moebatch::test
