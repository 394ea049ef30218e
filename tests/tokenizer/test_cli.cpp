// The tokenize / detokenize commands, run as the real binary.
#include <gtest/gtest.h>

#include "tests/common/subprocess.h"
#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

/// `moebatch <cmd> --tokenizer tests/data/qwen3-tokenizer args...`; stdout and exit code.
RunResult tok_cli(const std::string& cmd, std::vector<std::string> args = {}) {
  args.insert(args.begin(), {cmd, "--tokenizer", qwen3_dir().string()});
  return run_cli(args);
}

TEST(TokenizerCli, TokenizePrintsIdsAsJsonArray) {
  const RunResult r = tok_cli("tokenize", {"--text", "Hello, world!"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[9707,11,1879,0]\n");
  const RunResult j = tok_cli("tokenize", {"--text", "Hello, world!", "--json"});
  EXPECT_EQ(j.exit_code, 0) << j.err;
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed.at("ids"), nlohmann::json({9707, 11, 1879, 0}));
  EXPECT_EQ(parsed.at("num_tokens"), 4);
}

TEST(TokenizerCli, TokenizeFileMatchesLibrary) {
  TempDir dir;
  const std::string path = dir.file("tok_cli_input.txt");
  const std::string text = "中文测试：大模型\n<|im_start|>user\ndef f(x): return x\n";
  write_file(path, text);
  const RunResult r = tok_cli("tokenize", {"--file", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).get<std::vector<TokenId>>(), qwen3().encode(text));
}

TEST(TokenizerCli, DetokenizePrintsText) {
  const RunResult r = tok_cli("detokenize", {"--ids", "9707,11,1879,0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello, world!");
  const RunResult s = tok_cli("detokenize", {"--ids", "151644, 872", "--json"});
  EXPECT_EQ(nlohmann::json::parse(s.out).at("text"), "<|im_start|>user");
}

TEST(TokenizerCli, BadInputExitsWithCode2) {
  EXPECT_EQ(tok_cli("detokenize", {"--ids", "1,x,3"}).exit_code, 2);
  EXPECT_EQ(tok_cli("detokenize", {"--ids", "99999999"}).exit_code, 2);
  TempDir dir;
  const std::string bad_file = dir.file("tok_cli_bad.txt");
  write_file(bad_file, "bad \xff");
  EXPECT_EQ(tok_cli("tokenize", {"--file", bad_file}).exit_code, 2);
  EXPECT_EQ(tok_cli("tokenize").exit_code, 2);  // neither --text nor --file
  // A directory without tokenizer.json.
  EXPECT_EQ(run_cli({"tokenize", "--tokenizer", "/tmp", "--text", "hi"}).exit_code, 2);
  EXPECT_NE(tok_cli("tokenize", {"--text", "a", "--file", "b"}).exit_code, 0);
}

}  // namespace
}  // namespace moebatch::test
