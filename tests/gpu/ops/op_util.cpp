#include "tests/gpu/ops/op_util.h"

#include <algorithm>
#include <thread>

#include "kernels/random.cuh"

namespace moebatch::ops {

RandomBf16::RandomBf16(size_t n, float scale, std::mt19937& rng, cudaStream_t stream) : buf_(n), scale_(scale) {
  const uint64_t hi = rng();  // two statements: the order of the draws is fixed
  seed_ = (hi << 32) | rng();
  kernels::fill_uniform(buf_.get(), n, seed_, scale_, stream);
}

std::vector<uint16_t> RandomBf16::original(cudaStream_t stream) const {
  DevBuf<bf16> scratch(buf_.size());
  kernels::fill_uniform(scratch.get(), scratch.size(), seed_, scale_, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return scratch.download<uint16_t>();
}

void add_rmsnorm_ref(const std::vector<float>& in, const std::vector<float>* residual,
                     const std::vector<float>& w, int rows, int cols, double eps, float offset,
                     std::vector<float>& new_res, std::vector<double>& ref) {
  new_res.resize(in.size());
  ref.resize(in.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      new_res[i] = residual ? round_bf((*residual)[i] + in[i]) : in[i];
      ss += static_cast<double>(new_res[i]) * new_res[i];
    }
    const double rstd = 1.0 / std::sqrt(ss / cols + eps);
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      ref[i] = new_res[i] * rstd * (offset + w[c]);
    }
  }
}

void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  const size_t workers = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (size_t i = n * w / workers; i < n * (w + 1) / workers; ++i) fn(i);
    });
  for (auto& t : pool) t.join();
}

}  // namespace moebatch::ops
