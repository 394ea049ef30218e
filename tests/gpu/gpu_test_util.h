// Helpers for the kernel tests: GPU skip, device buffers, host bf16, random inputs and the
// relative-error check every test uses. Inputs are fresh random data each run; the seed is
// printed with any failure so a run can be replayed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/types.cuh"

namespace moebatch::test {

using kernels::bf16;

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

/// Owning device buffer of n elements of T.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, (n ? n : 1) * sizeof(T))); }
  template <typename H>
  explicit DevBuf(const std::vector<H>& host) : DevBuf(host.size()) { upload(host); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  template <typename H>
  void upload(const std::vector<H>& host) {
    static_assert(sizeof(H) == sizeof(T));
    EXPECT_EQ(host.size(), n_);
    CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename H>
  std::vector<H> download() const {
    static_assert(sizeof(H) == sizeof(T));
    std::vector<H> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Fills every byte with 0xff: NaN for floats and bf16, -1 for ints (catches unwritten output).
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xff, (n_ ? n_ : 1) * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

/// Host bf16 as raw bits, converted with round-to-nearest-even (as __float2bfloat16).
inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf2f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Rounds a float to the nearest bf16 value.
inline float round_bf(float f) { return bf2f(f2bf(f)); }

/// n bf16 values uniform in [-scale, scale].
inline std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f2bf(d(rng));
  return v;
}
inline std::vector<float> to_float(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf2f(v[i]);
  return f;
}

/// ‖out − ref‖ / ‖ref‖ <= tol, and every element of out finite (NaN never passes).
inline ::testing::AssertionResult close_rel_l2(const std::vector<float>& out,
                                               const std::vector<double>& ref, double tol) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]))
      return ::testing::AssertionFailure() << "non-finite output at " << i << " (unwritten?)";
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1e-30));
  if (rel > tol) return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol;
  return ::testing::AssertionSuccess() << "relative L2 error " << rel;
}

}  // namespace moebatch::test
