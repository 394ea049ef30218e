#include "engine/cpu/comm.h"

#include <algorithm>

#include "common/error.h"

namespace moebatch {

InProcessComm::InProcessComm(int world)
    : world_(world), barrier_(world), ptrs_(static_cast<size_t>(world), nullptr) {
  MB_CHECK(world >= 1, "communicator world must be >= 1");
}

void InProcessComm::all_reduce_sum(int rank, void* data, size_t n, CommDType dtype,
                                   CommStream /*stream*/) {
  MB_CHECK(dtype == CommDType::F32, "in-process communicator: fp32 only");
  if (world_ == 1) return;
  auto* out = static_cast<float*>(data);
  ptrs_[rank] = out;
  barrier_.arrive_and_wait();  // every rank's input is published
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < world_; ++r) {
    const float* p = ptrs_[r];
    for (size_t i = 0; i < n; ++i) sum[i] += p[i];
  }
  barrier_.arrive_and_wait();  // nobody overwrites its input while others still read it
  std::copy(sum.begin(), sum.end(), out);
}

void InProcessComm::all_gather(int rank, const void* send, void* recv, size_t n, CommDType dtype,
                               CommStream /*stream*/) {
  MB_CHECK(dtype == CommDType::F32, "in-process communicator: fp32 only");
  const auto* in = static_cast<const float*>(send);
  auto* out = static_cast<float*>(recv);
  ptrs_[rank] = in;
  if (world_ > 1) barrier_.arrive_and_wait();  // every rank's input is published
  for (int r = 0; r < world_; ++r) std::copy(ptrs_[r], ptrs_[r] + n, out + r * n);
  if (world_ > 1) barrier_.arrive_and_wait();  // inputs stay valid until everyone has copied
}

}  // namespace moebatch
