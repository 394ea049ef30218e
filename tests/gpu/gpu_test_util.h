// The GPU tests' fixture and helpers: skip without a CUDA device, a stream and a fresh seed that
// is printed (test property and failure trace) so a run can be replayed, host random bf16 and
// the relative-error check. Device buffers and bf16 conversions are the op-case library's
// (tests/gpu/ops/op_util.h, header-only parts).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "tests/gpu/ops/op_util.h"

namespace moebatch::test {

using kernels::bf16;
using ops::bf2f;
using ops::DevBuf;
using ops::f2bf;
using ops::round_bf;
using ops::to_float;

/// Base fixture: skips without a CUDA device, owns a stream and a fresh seed.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    CUDA_CHECK(cudaStreamCreate(&stream));
    seed = std::random_device{}();
    rng.seed(seed);
    RecordProperty("seed", std::to_string(seed));
  }
  void TearDown() override {
    if (stream) CUDA_CHECK(cudaStreamDestroy(stream));
  }
  void sync() { CUDA_CHECK(cudaStreamSynchronize(stream)); }
  std::string trace() const { return "seed " + std::to_string(seed); }

  cudaStream_t stream = nullptr;
  uint32_t seed = 0;
  std::mt19937 rng;
};

/// n bf16 values uniform in [-scale, scale], drawn on the host.
inline std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f2bf(d(rng));
  return v;
}

/// ‖out − ref‖ / ‖ref‖ <= tol, and every element of out finite (NaN never passes).
inline ::testing::AssertionResult close_rel_l2(const std::vector<float>& out, const std::vector<double>& ref,
                                               double tol) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t bad = 0;
  const double rel = ops::rel_l2_error(out, ref, bad);
  if (rel < 0) return ::testing::AssertionFailure() << "non-finite output at " << bad << " (unwritten?)";
  if (rel > tol) return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol;
  return ::testing::AssertionSuccess() << "relative L2 error " << rel;
}

}  // namespace moebatch::test
