// Host-side helpers of the op cases: owning device buffers, bf16 on the host, random inputs
// filled on the device, and a parallel loop for the fp64 references of the large shapes. No
// gtest here: the kernel benchmark and the kernel lab link these too.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cuda_check.cuh"
#include "kernels/types.cuh"

namespace moebatch::ops {

using kernels::bf16;

/// Owning device buffer of n elements of T (empty when default-constructed).
template <typename T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, (n ? n : 1) * sizeof(T))); }
  template <typename H>
  explicit DevBuf(const std::vector<H>& host) : DevBuf(host.size()) { upload(host); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(DevBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  template <typename H>
  void upload(const std::vector<H>& host) {
    static_assert(sizeof(H) == sizeof(T));
    MB_CHECK(host.size() == n_, "DevBuf::upload: host size differs from the buffer's");
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
  size_t n_ = 0;
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
inline std::vector<float> to_float(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf2f(v[i]);
  return f;
}

/// ‖out − ref‖ / ‖ref‖ for equal-size vectors. Returns -1 with `bad` = the index of the first
/// non-finite element of out (an unwritten, NaN-poisoned output never passes).
inline double rel_l2_error(const std::vector<float>& out, const std::vector<double>& ref, size_t& bad) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      bad = i;
      return -1;
    }
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

/// A bf16 input of n values uniform in [-scale, scale], filled on the device from one seed drawn
/// from the case's generator (kernels::fill_uniform: element i from (seed, i)). Benchmark-sized
/// tensors then cost no host time, and original() regenerates the values for the CPU reference
/// even after a kernel changed the buffer in place.
class RandomBf16 {
 public:
  RandomBf16() = default;
  RandomBf16(size_t n, float scale, std::mt19937& rng, cudaStream_t stream);
  bf16* get() const { return buf_.get(); }
  size_t size() const { return buf_.size(); }
  /// The buffer as it is now (after a kernel ran).
  std::vector<uint16_t> current() const { return buf_.download<uint16_t>(); }
  /// The values as filled, regenerated in a scratch device buffer.
  std::vector<uint16_t> original(cudaStream_t stream) const;
  std::vector<float> original_f(cudaStream_t stream) const { return to_float(original(stream)); }

 private:
  DevBuf<bf16> buf_;
  uint64_t seed_ = 0;
  float scale_ = 0.f;
};

/// fn(i) for i in [0, n) over the host's cores, in contiguous ranges: the fp64 references of the
/// benchmark shapes take billions of multiply-adds. fn must only write state owned by its i.
void parallel_for(size_t n, const std::function<void(size_t)>& fn);

/// The (add +) RMSNorm reference of `rows` rows of `cols`: new_res = bf16(residual + in) (in
/// itself when residual is null), ref = new_res · rstd · (offset + w) with rstd from the fp64
/// mean square (kernels::add_rmsnorm / rmsnorm, and the router's fused norm).
void add_rmsnorm_ref(const std::vector<float>& in, const std::vector<float>* residual,
                     const std::vector<float>& w, int rows, int cols, double eps, float offset,
                     std::vector<float>& new_res, std::vector<double>& ref);

}  // namespace moebatch::ops
