// The real `moebatch` binary: logits and generate against the fixture oracle, and clear errors
// (exit status 2) for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "tests/engine/reference.h"

namespace moebatch {
namespace {

struct Proc {
  int status = -1;
  std::string out;
};

// Runs the CLI with `args`; stdout captured, stderr merged when `merge_err`.
Proc run_cli(const std::string& args, bool merge_err = false) {
  std::string cmd = std::string(MOEBATCH_BIN) + " " + args + (merge_err ? " 2>&1" : " 2>/dev/null");
  Proc p;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  int st = pclose(f);
  p.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return p;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

TEST(Cli, LogitsMatchReference) {
  const std::string model = test_data_dir() + "/qwen3_moe_tiny";
  auto ref = load_reference("qwen3_moe_tiny");
  const auto& r = ref[2];
  TempDir tmp;
  const std::string out = tmp.path() + "/l.safetensors";
  auto p =
      run_cli("logits --model " + model + " --tokens " + join(r.prompt) + " --tp 2 --out " + out);
  ASSERT_EQ(p.status, 0);
  SafetensorsFile f(out);
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
  const std::string model = test_data_dir() + "/qwen3_dense_tiny";
  auto ref = load_reference("qwen3_dense_tiny");
  const auto& r = ref[0];
  TempDir tmp;
  const std::string out = tmp.path() + "/l.safetensors";
  auto p = run_cli("logits --model " + model + " --tokens " + join(r.prompt) +
                       " --backend cuda --out " + out,
                   true);
  if (p.status != 0) {
    EXPECT_EQ(p.status, 2) << p.out;
    EXPECT_NE(p.out.find("not available"), std::string::npos) << p.out;
    GTEST_SKIP() << "no usable CUDA backend here: " << p.out;
  }
  SafetensorsFile f(out);
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
  auto p = run_cli("generate --model " + test_data_dir() + "/qwen3_dense_tiny --tokens " +
                   join(r.prompt) + " --max-tokens 8 --temperature 0 --json");
  ASSERT_EQ(p.status, 0);
  auto j = nlohmann::json::parse(p.out);
  auto tokens = j.at("tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), 8u);
  for (size_t s = 0; s < 8 && r.greedy_margin[s] > 1e-4f; ++s) EXPECT_EQ(tokens[s], r.greedy[s]);
}

TEST(Cli, BadInputGivesClearErrorAndStatus2) {
  const std::string model = test_data_dir() + "/qwen3_moe_tiny";
  auto p = run_cli("generate --model " + model + " --tokens 1,x --max-tokens 2", true);
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("'x' is not a token id"), std::string::npos) << p.out;
  p = run_cli("generate --model " + model + " --tokens 1,5000 --max-tokens 2", true);
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("outside vocab"), std::string::npos) << p.out;
  p = run_cli("generate --model /nonexistent/model --tokens 1 --max-tokens 2", true);
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("/nonexistent/model"), std::string::npos) << p.out;
  p = run_cli("generate --model " + model + " --tokens 1 --max-tokens 2 --tp 3", true);
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("tp = 3"), std::string::npos) << p.out;
}

}  // namespace
}  // namespace moebatch
