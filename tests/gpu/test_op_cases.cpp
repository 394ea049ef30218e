// Every row of the op-case table (tests/gpu/ops/op_table.cpp) against its CPU reference on fresh
// random inputs, outputs poisoned with NaN before the launch: one parameterized test per case,
// named after the op and its shapes. Without a GPU each skips.
#include <algorithm>
#include <cctype>
#include <ostream>
#include <set>
#include <string>

#include "common/error.h"
#include "kernels/cuda_check.cuh"
#include "kernels/moe_wgmma.cuh"
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

// moe_wgmma's check of its TMA rows variant, which comes before any launch (host checks only:
// runs without a GPU; rows_cap 0 returns before touching the fake operands).
TEST(MoeWgmmaParams, RefusesTmaRowsWithAGather) {
  alignas(16) static kernels::bf16 operand[8];
  static const int32_t offsets[2] = {0, 0};
  static const int32_t sorted[1] = {0};
  const kernels::MoeWgmmaParams ok{.out = operand, .in = operand, .weight = operand, .expert_offsets = offsets,
                                   .num_experts = 1, .n = 16, .k = 16, .rows_cap = 0};
  EXPECT_NO_THROW(kernels::moe_wgmma(ok, nullptr));
  kernels::MoeWgmmaParams p = ok;
  p.tma_rows = true;
  EXPECT_NO_THROW(kernels::moe_wgmma(p, nullptr));
  p.sorted_ids = sorted;  // TMA rows are rows in sorted order: no gather
  p.num_pairs = 1;
  EXPECT_THROW(kernels::moe_wgmma(p, nullptr), Error);
}

}  // namespace
}  // namespace moebatch::test
