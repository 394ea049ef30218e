// Every row of the op-case table (tests/gpu/ops/op_table.cpp) against its CPU reference on fresh
// random inputs, outputs poisoned with NaN before the launch: one parameterized test per case,
// named after the op and its shapes. Without a GPU each skips.
#include <algorithm>
#include <cctype>
#include <ostream>
#include <set>
#include <string>

#include "kernels/cuda_check.cuh"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/ops/op_case.h"

namespace moebatch::ops {
// gtest prints the parameter beside the test name (which already says op and shape), and ctest
// names carry it too: what the name does not say.
void PrintTo(const OpCaseDef& d, std::ostream* os) {
  *os << op_family_name(d.family) << " " << weight_format_name(d.format) << " tol " << d.tol;
}
}  // namespace moebatch::ops

namespace moebatch::test {
namespace {

using ops::OpCaseDef;

// "moe_gemm gate_up+silu" + "t12 E32 k8" -> "moe_gemm_gate_up_silu__t12_E32_k8" (gtest names:
// letters, digits and underscores).
std::string test_name(const OpCaseDef& d) {
  std::string s = d.name + "__" + d.shape;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class OpCaseTest : public GpuTest, public ::testing::WithParamInterface<OpCaseDef> {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    env.stream = stream;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&env.num_sms, cudaDevAttrMultiProcessorCount, device));
    const ops::OpFamily family = GetParam().family;
    if (family == ops::OpFamily::gemm || family == ops::OpFamily::quant) CUBLAS_CHECK(cublasCreate(&env.cublas));
  }
  void TearDown() override {
    if (env.cublas) CUBLAS_CHECK(cublasDestroy(env.cublas));
    GpuTest::TearDown();
  }
  ops::OpEnv env;
};

TEST_P(OpCaseTest, MatchesCpuReference) {
  SCOPED_TRACE(trace());
  const OpCaseDef& def = GetParam();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (def.available && !def.available(device)) GTEST_SKIP() << def.name << " does not run on this GPU";
  const auto c = def.make();
  c->setup(env, seed);
  const ops::OpCheck result = ops::run_and_check(*c, env, def.tol);
  RecordProperty("check", result.detail());
  EXPECT_TRUE(result.ok()) << result.detail();
}

INSTANTIATE_TEST_SUITE_P(gpu, OpCaseTest, ::testing::ValuesIn(ops::op_cases_test()),
                         [](const ::testing::TestParamInfo<OpCaseDef>& info) { return test_name(info.param); });

// The tables themselves (no GPU needed): unique names, every kernel family covered by the
// correctness table, benchmark rows with a batch.
TEST(OpTable, TablesAreWellFormed) {
  std::set<std::string> names;
  std::set<ops::OpFamily> families;
  for (const auto& d : ops::op_cases_test()) {
    EXPECT_TRUE(names.insert(test_name(d)).second) << "duplicate case " << test_name(d);
    EXPECT_TRUE(d.make) << d.name;
    EXPECT_GE(d.tol, 0) << d.name;
    families.insert(d.family);
  }
  EXPECT_EQ(families.size(), 12u) << "a kernel family has no correctness case";
  std::set<std::pair<int, std::string>> bench;
  for (const auto& d : ops::op_cases_bench()) {
    EXPECT_GT(d.batch, 0) << d.name;
    EXPECT_TRUE(bench.insert({d.batch, d.name}).second) << "duplicate benchmark row " << d.name << " at " << d.batch;
  }
}

}  // namespace
}  // namespace moebatch::test
