// Sampler properties that are not a comparison with a reference and so have no row in the
// op-case table: draws of one sequence vary with its step.
#include <numeric>
#include <set>
#include <vector>

#include "kernels/sampling.cuh"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::test {
namespace {

class SamplingDrawsTest : public GpuTest {};

TEST_F(SamplingDrawsTest, TopKTopPDrawsVaryWithStep) {
  SCOPED_TRACE(trace());
  // A flat distribution over 64 candidates: 200 steps of one sequence must not repeat one token.
  const int vocab = 4096, batch = 200;
  std::vector<float> l(static_cast<size_t>(batch) * vocab, -10.f);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < 64; ++i) l[static_cast<size_t>(b) * vocab + i * 7] = 1.f;
  std::vector<uint64_t> steps(batch);
  std::iota(steps.begin(), steps.end(), 0);
  const ops::SamplingInputs in(l, std::vector<float>(batch, 1.f), std::vector<int32_t>(batch, 64),
                               std::vector<float>(batch, 1.f), std::vector<uint64_t>(batch, rng()), steps);
  DevBuf<int32_t> d_out(batch);
  d_out.poison();
  kernels::sample_top_k_top_p(in.params(d_out.get()), stream);
  sync();
  const auto out = d_out.download<int32_t>();
  std::set<int32_t> distinct(out.begin(), out.end());
  for (int32_t t : out) ASSERT_TRUE(t % 7 == 0 && t / 7 < 64) << "sampled a token outside the top-k: " << t;
  EXPECT_GT(distinct.size(), 40u);  // 200 uniform draws over 64: ~61 distinct expected
}

}  // namespace
}  // namespace moebatch::test
