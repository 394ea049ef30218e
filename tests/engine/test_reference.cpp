// Acceptance: every fixture against its float64 oracle (logits at every comparable position,
// greedy continuations until the first near-tie), and tensor-parallel runs against TP=1.
#include <gtest/gtest.h>

#include "tests/engine/reference.h"

namespace moebatch {
namespace {

// fp32 arithmetic error is ~1e-6 relative on router logits; skip positions after a closer tie.
constexpr float kRouteGap = 1e-4f;
constexpr float kGreedyMargin = 1e-4f;
constexpr double kRelTol = 1e-4;

class Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Fixture, LogitsMatchReference) {
  auto ref = load_reference(GetParam());
  auto eng = make_engine(GetParam());
  const int64_t V = eng->config().vocab_size;
  double worst = 0;
  size_t compared = 0, total = 0;
  for (const auto& r : ref) {
    auto logits = eng->score(r.prompt);
    const size_t upto = comparable_prefix(r.route_gap, kRouteGap);
    total += r.prompt.size();
    for (size_t t = 0; t < upto; ++t) {
      double e = rel_err(logits.data() + t * V, r.logits.data() + t * V, V);
      worst = std::max(worst, e);
      ++compared;
      EXPECT_LT(e, kRelTol) << GetParam() << " prompt len " << r.prompt.size() << " pos " << t;
    }
  }
  EXPECT_GT(compared, total / 2) << "too few comparable positions";
  RecordProperty("worst_rel_err", std::to_string(worst));
  std::printf("%s: %zu/%zu positions compared, worst relative error %.3g\n", GetParam().c_str(),
              compared, total, worst);
}

TEST_P(Fixture, GreedyMatchesReferenceUntilNearTie) {
  auto ref = load_reference(GetParam());
  auto eng = make_engine(GetParam());
  size_t checked = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto& r = ref[i];
    if (comparable_prefix(r.route_gap, kRouteGap) < r.prompt.size()) continue;
    Request q;
    q.id = i;
    q.prompt = r.prompt;
    q.sampling.temperature = 0.0f;
    q.sampling.max_tokens = static_cast<int64_t>(r.greedy.size());
    eng->add(q);
    auto fin = run_to_completion(*eng);
    ASSERT_EQ(fin.size(), 1u);
    for (size_t s = 0; s < r.greedy.size() && r.greedy_margin[s] > kGreedyMargin; ++s) {
      ASSERT_EQ(fin[0].tokens[s], r.greedy[s]) << GetParam() << " prompt " << i << " step " << s;
      ++checked;
    }
  }
  EXPECT_GT(checked, 8u) << "too few greedy steps compared";
}

// TP=2 and TP=4 (and expert-parallel) against TP=1 on every position of the longest prompt.
TEST_P(Fixture, TensorParallelMatchesSingleRank) {
  auto ref = load_reference(GetParam());
  const auto& prompt = ref.back().prompt;
  auto base = make_engine(GetParam())->score(prompt);
  const int64_t V = static_cast<int64_t>(base.size() / prompt.size());
  const size_t upto = comparable_prefix(ref.back().route_gap, kRouteGap);
  struct Run {
    int tp;
    ExpertSplit split;
  };
  std::vector<Run> runs = {{2, ExpertSplit::Intermediate}, {4, ExpertSplit::Intermediate}};
  if (GetParam() != "qwen3_dense_tiny") runs.push_back({4, ExpertSplit::Expert});
  for (auto run : runs) {
    auto got = make_engine(GetParam(), run.tp, {}, run.split)->score(prompt);
    ASSERT_EQ(got.size(), base.size());
    for (size_t t = 0; t < upto; ++t) {
      // fp32 partial sums added in another order: ~1e-6 typically, amplified at some positions
      // (1.8e-5 seen once on the NVFP4 fixture, whose weights take few distinct values)
      EXPECT_LT(rel_err(got.data() + t * V, base.data() + t * V, V), 3e-5)
          << "tp " << run.tp << " pos " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Fixture,
                         ::testing::Values("qwen3_moe_tiny", "qwen2_moe_tiny", "qwen3_dense_tiny",
                                           "qwen3_moe_tiny_fp8", "qwen3_moe_tiny_nvfp4",
                                           "qwen3moe_tiny_q4km", "qwen3_next_tiny"));

}  // namespace
}  // namespace moebatch
