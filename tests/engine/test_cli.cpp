// The real `moebatch` binary: logits and generate against the fixture oracle, and clear errors
// (exit status 2) for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

using test::run_cli;
using test::TempDir;

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

/// `moebatch logits` of prompt on a fixture with extra flags, written to dir/logits.safetensors.
test::RunResult run_logits(const TempDir& dir, const std::string& fixture,
                           const std::vector<int32_t>& prompt,
                           const std::vector<std::string>& extra) {
  const std::string model = test_data_dir() + "/" + fixture, out = dir.file("logits.safetensors");
  std::vector<std::string> args{"logits", "--model", model, "--tokens", join(prompt), "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_cli(args);
}

TEST(Cli, LogitsMatchReference) {
  const RefPrompt r = load_reference("qwen3_moe_tiny")[2];
  TempDir tmp;
  auto p = run_logits(tmp, "qwen3_moe_tiny", r.prompt, {"--tp", "2"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  SafetensorsFile f(tmp.file("logits.safetensors"));
  const auto& t = f.at("logits");
  ASSERT_EQ(t.dtype, DType::F32);
  ASSERT_EQ(t.shape, (std::vector<int64_t>{static_cast<int64_t>(r.prompt.size()), 1024}));
  auto got = floats(t);
  for (size_t i = 0; i < comparable_prefix(r.route_gap, 1e-4f); ++i) {
    EXPECT_LT(rel_err(got.data() + i * 1024, r.logits.data() + i * 1024, 1024), 1e-4) << i;
  }
}

// Where a GPU is present the CUDA backend must reproduce the oracle within bf16 tolerance; where
// none is (or the build has no CUDA), the command must fail cleanly with status 2.
TEST(Cli, CudaBackendMatchesReferenceOrSaysUnavailable) {
  const RefPrompt r = load_reference("qwen3_dense_tiny")[0];
  TempDir tmp;
  auto p = run_logits(tmp, "qwen3_dense_tiny", r.prompt, {"--backend", "cuda"});
  if (p.exit_code != 0) {
    EXPECT_EQ(p.exit_code, 2) << p.err;
    EXPECT_NE(p.err.find("not available"), std::string::npos) << p.err;
    GTEST_SKIP() << "no usable CUDA backend here: " << p.err;
  }
  SafetensorsFile f(tmp.file("logits.safetensors"));
  auto got = floats(f.at("logits"));
  const int64_t vocab = 1024;
  ASSERT_EQ(got.size(), r.prompt.size() * vocab);
  // Dense model: no router ties, every position is comparable; bf16 weights and activations.
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    EXPECT_LT(rel_err(got.data() + i * vocab, r.logits.data() + i * vocab, vocab), 3e-2) << i;
  }
}

TEST(Cli, GenerateJsonMatchesGreedyReference) {
  auto ref = load_reference("qwen3_dense_tiny");
  const auto& r = ref[1];
  auto p = run_cli({"generate", "--model", test_data_dir() + "/qwen3_dense_tiny", "--tokens",
                    join(r.prompt), "--max-tokens", "8", "--temperature", "0", "--json"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  auto j = nlohmann::json::parse(p.out);
  auto tokens = j.at("tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), 8u);
  for (size_t s = 0; s < 8 && r.greedy_margin[s] > 1e-4f; ++s) EXPECT_EQ(tokens[s], r.greedy[s]);
}

TEST(Cli, BadInputGivesClearErrorAndStatus2) {
  const std::string model = test_data_dir() + "/qwen3_moe_tiny";
  auto p = run_cli({"generate", "--model", model, "--tokens", "1,x", "--max-tokens", "2"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("'x' is not a token id"), std::string::npos) << p.err;
  p = run_cli({"generate", "--model", model, "--tokens", "1,5000", "--max-tokens", "2"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("outside vocab"), std::string::npos) << p.err;
  p = run_cli({"generate", "--model", "/nonexistent/model", "--tokens", "1", "--max-tokens", "2"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("/nonexistent/model"), std::string::npos) << p.err;
  p = run_cli({"generate", "--model", model, "--tokens", "1", "--max-tokens", "2", "--tp", "3"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("tp = 3"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace moebatch
