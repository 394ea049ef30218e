#include "engine/cpu/comm.h"

#include <algorithm>

#include "common/error.h"

namespace moebatch {

InProcessComm::InProcessComm(int world)
    : world_(world), barrier_(world), ptrs_(static_cast<size_t>(world), nullptr) {
  MB_CHECK(world >= 1, "communicator world must be >= 1");
}

void InProcessComm::all_reduce_sum(int rank, float* data, size_t n) {
  if (world_ == 1) return;
  ptrs_[rank] = data;
  barrier_.arrive_and_wait();  // every rank's input is published
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < world_; ++r) {
    const float* p = ptrs_[r];
    for (size_t i = 0; i < n; ++i) sum[i] += p[i];
  }
  barrier_.arrive_and_wait();  // nobody overwrites its input while others still read it
  std::copy(sum.begin(), sum.end(), data);
}

void InProcessComm::gather_cols(int rank, const float* local, int64_t rows, int64_t cols,
                                float* out) {
  if (world_ == 1) {
    std::copy(local, local + rows * cols, out);
    return;
  }
  ptrs_[rank] = local;
  barrier_.arrive_and_wait();
  if (rank == 0) {
    for (int r = 0; r < world_; ++r) {
      for (int64_t i = 0; i < rows; ++i) {
        std::copy(ptrs_[r] + i * cols, ptrs_[r] + (i + 1) * cols,
                  out + i * cols * world_ + r * cols);
      }
    }
  }
  barrier_.arrive_and_wait();
}

}  // namespace moebatch
