// cuBLAS linear wrapper and the GPU samplers against CPU references on fresh random logits;
// sampling is also checked for batch invariance (a row's token ignores its neighbours).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kernels/gemm.cuh"
#include "kernels/random.cuh"
#include "kernels/sampling.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch::test {
namespace {

using namespace moebatch::kernels;

class SamplingGemmTest : public GpuTest {};

TEST_F(SamplingGemmTest, LinearMatchesReferenceBf16AndFp32Out) {
  SCOPED_TRACE(trace());
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  const int m = 5, n = 1000, k = 256;
  auto x = random_bf16(rng, static_cast<size_t>(m) * k, 1.f);
  auto w = random_bf16(rng, static_cast<size_t>(n) * k, 0.1f);
  DevBuf<bf16> d_x(x), d_w(w), d_ob(static_cast<size_t>(m) * n);
  DevBuf<float> d_of(static_cast<size_t>(m) * n);
  d_ob.poison();
  d_of.poison();
  linear(handle, stream, d_ob.get(), d_x.get(), d_w.get(), m, n, k);
  linear(handle, stream, d_of.get(), d_x.get(), d_w.get(), m, n, k);
  sync();
  std::vector<double> ref(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int c = 0; c < k; ++c) s += static_cast<double>(bf2f(x[i * k + c])) * bf2f(w[static_cast<size_t>(j) * k + c]);
      ref[static_cast<size_t>(i) * n + j] = s;
    }
  EXPECT_TRUE(close_rel_l2(to_float(d_ob.download<uint16_t>()), ref, 5e-3));
  EXPECT_TRUE(close_rel_l2(d_of.download<float>(), ref, 1e-5));
  CUBLAS_CHECK(cublasDestroy(handle));
}

std::vector<float> random_logits(std::mt19937& rng, int batch, int vocab, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> l(static_cast<size_t>(batch) * vocab);
  for (auto& v : l) v = nd(rng);
  return l;
}

TEST_F(SamplingGemmTest, GreedyPicksArgmaxLowestIdOnTies) {
  SCOPED_TRACE(trace());
  const int batch = 9, vocab = 151936;
  auto l = random_logits(rng, batch, vocab, 3.f);
  l[2 * static_cast<size_t>(vocab) + 777] = 100.f;  // planted tie: lowest id must win
  l[2 * static_cast<size_t>(vocab) + 90000] = 100.f;
  DevBuf<float> d_l(l);
  DevBuf<int32_t> d_out(batch);
  d_out.poison();
  sample_greedy(d_out.get(), d_l.get(), batch, vocab, stream);
  sync();
  const auto got = d_out.download<int32_t>();
  for (int b = 0; b < batch; ++b) {
    const auto* row = &l[static_cast<size_t>(b) * vocab];
    EXPECT_EQ(got[b], std::max_element(row, row + vocab) - row) << "row " << b;
  }
  EXPECT_EQ(got[2], 777);
}

struct RowControls {
  float temperature, top_p;
  int top_k;
  uint64_t seed, step;
};

// Checks a sampled token against the documented algorithm in fp64. Draws that land within
// `slack` of a boundary (cumulative-mass or top-p cut) may go either way in fp32.
::testing::AssertionResult check_sample(const float* row, int vocab, const RowControls& c, int got) {
  if (!(c.temperature > 0.f)) {
    const int want = static_cast<int>(std::max_element(row, row + vocab) - row);
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "greedy row: got " << got << " want " << want;
  }
  int k = c.top_k <= 0 || c.top_k > kSamplingMaxK ? kSamplingMaxK : c.top_k;
  k = std::min(k, vocab);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  std::vector<double> cum(k);
  double total = 0;
  for (int i = 0; i < k; ++i) cum[i] = (total += std::exp((row[order[i]] - row[order[0]]) / static_cast<double>(c.temperature)));
  int keep = 0;
  while (keep < k && (keep == 0 || cum[keep - 1] < c.top_p * total)) ++keep;
  const double u = uniform01(c.seed, c.step) * cum[keep - 1];
  int want = 0;
  while (want < keep - 1 && cum[want] <= u) ++want;
  if (order[want] == got) return ::testing::AssertionSuccess();
  const int pos = static_cast<int>(std::find(order.begin(), order.begin() + k, got) - order.begin());
  const double slack = 1e-4 * total;
  if (pos < k) {
    const int lo = std::min(pos, want);
    if (std::abs(cum[lo] - u) < slack) return ::testing::AssertionSuccess();      // draw at a boundary
    if (pos == keep && std::abs(cum[keep - 1] - c.top_p * total) < slack) return ::testing::AssertionSuccess();  // cut
  }
  return ::testing::AssertionFailure() << "got " << got << " (rank " << pos << ") want " << order[want]
                                       << " (rank " << want << "), kept " << keep << " of " << k;
}

TEST_F(SamplingGemmTest, TopKTopPMatchesReferenceAndIsBatchInvariant) {
  SCOPED_TRACE(trace());
  const int vocab = 20000;
  const std::vector<RowControls> base = {
      {1.0f, 1.0f, 50, 0, 0},  {0.7f, 0.9f, 0, 0, 0},   {1.5f, 0.5f, 1000, 0, 0},
      {0.0f, 0.9f, 40, 0, 0},  {1.0f, 0.0f, 20, 0, 0},  {1.0f, 1.0f, 1, 0, 0},
      {2.0f, 0.95f, 5000, 0, 0}, {0.3f, 0.8f, 7, 0, 0},
  };
  std::vector<RowControls> rows;
  for (int rep = 0; rep < 6; ++rep)
    for (auto c : base) {
      c.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
      c.step = rng() % 1000;
      rows.push_back(c);
    }
  const int batch = static_cast<int>(rows.size());
  auto l = random_logits(rng, batch, vocab, 2.f);
  // Quantized logits in a few rows create ties at the top-k boundary.
  for (int i = 0; i < vocab; ++i) l[static_cast<size_t>(3) * vocab + i] = std::round(l[static_cast<size_t>(3) * vocab + i] * 4) / 4;
  for (int i = 0; i < vocab; ++i) l[static_cast<size_t>(7) * vocab + i] = std::round(l[static_cast<size_t>(7) * vocab + i] * 2) / 2;

  auto run = [&](const std::vector<int>& perm) {
    std::vector<float> lp(l.size()), temp(batch), top_p(batch);
    std::vector<int32_t> top_k(batch);
    std::vector<uint64_t> seeds(batch), steps(batch);
    for (int b = 0; b < batch; ++b) {
      const int src = perm[b];
      std::copy_n(&l[static_cast<size_t>(src) * vocab], vocab, &lp[static_cast<size_t>(b) * vocab]);
      temp[b] = rows[src].temperature;
      top_p[b] = rows[src].top_p;
      top_k[b] = rows[src].top_k;
      seeds[b] = rows[src].seed;
      steps[b] = rows[src].step;
    }
    DevBuf<float> d_l(lp), d_t(temp), d_p(top_p);
    DevBuf<int32_t> d_k(top_k), d_out(batch);
    DevBuf<uint64_t> d_s(seeds), d_st(steps);
    d_out.poison();
    SamplingParams p;
    p.out_tokens = d_out.get();
    p.logits = d_l.get();
    p.temperature = d_t.get();
    p.top_k = d_k.get();
    p.top_p = d_p.get();
    p.seeds = d_s.get();
    p.steps = d_st.get();
    p.batch = batch;
    p.vocab = vocab;
    sample_top_k_top_p(p, stream);
    sync();
    const auto out = d_out.download<int32_t>();
    std::vector<int32_t> by_row(batch);
    for (int b = 0; b < batch; ++b) by_row[perm[b]] = out[b];
    return by_row;
  };
  std::vector<int> ident(batch);
  std::iota(ident.begin(), ident.end(), 0);
  const auto got = run(ident);
  for (int b = 0; b < batch; ++b)
    EXPECT_TRUE(check_sample(&l[static_cast<size_t>(b) * vocab], vocab, rows[b], got[b])) << "row " << b;
  auto perm = ident;
  std::shuffle(perm.begin(), perm.end(), rng);
  EXPECT_EQ(run(perm), got) << "a row's token changed with its position in the batch";
}

TEST_F(SamplingGemmTest, TopKTopPDrawsVaryWithStep) {
  SCOPED_TRACE(trace());
  // A flat distribution over 64 candidates: 200 steps of one sequence must not repeat one token.
  const int vocab = 4096, batch = 200;
  std::vector<float> l(static_cast<size_t>(batch) * vocab, -10.f);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < 64; ++i) l[static_cast<size_t>(b) * vocab + i * 7] = 1.f;
  std::vector<float> temp(batch, 1.f), top_p(batch, 1.f);
  std::vector<int32_t> top_k(batch, 64);
  std::vector<uint64_t> seeds(batch, rng()), steps(batch);
  std::iota(steps.begin(), steps.end(), 0);
  DevBuf<float> d_l(l), d_t(temp), d_p(top_p);
  DevBuf<int32_t> d_k(top_k), d_out(batch);
  DevBuf<uint64_t> d_s(seeds), d_st(steps);
  SamplingParams p;
  p.out_tokens = d_out.get();
  p.logits = d_l.get();
  p.temperature = d_t.get();
  p.top_k = d_k.get();
  p.top_p = d_p.get();
  p.seeds = d_s.get();
  p.steps = d_st.get();
  p.batch = batch;
  p.vocab = vocab;
  sample_top_k_top_p(p, stream);
  sync();
  const auto out = d_out.download<int32_t>();
  std::set<int32_t> distinct(out.begin(), out.end());
  for (int32_t t : out) ASSERT_TRUE(t % 7 == 0 && t / 7 < 64) << "sampled a token outside the top-k: " << t;
  EXPECT_GT(distinct.size(), 40u);  // 200 uniform draws over 64: ~61 distinct expected
}

}  // namespace
}  // namespace moebatch::test
