// In-process communicator for tensor-parallel ranks running as threads of one process. It mirrors
// the NCCL calls the GPU backend makes (all-reduce sum, gather) so the sharding math is tested on
// CPU-only CI machines.
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moebatch {

/// Collective operations among `world` threads; every rank must make the same calls in order.
class InProcessComm {
 public:
  /// world >= 1 ranks.
  explicit InProcessComm(int world);

  /// In-place sum over ranks of data[0..n). Every rank gets bitwise the same result (ranks are
  /// summed in rank order).
  void all_reduce_sum(int rank, float* data, size_t n);
  /// Column gather: each rank holds local [rows, cols]; rank 0's `out` gets [rows, world*cols]
  /// with rank r's block at columns r*cols. Other ranks' `out` is untouched (may be null).
  void gather_cols(int rank, const float* local, int64_t rows, int64_t cols, float* out);
  /// Number of ranks.
  int world() const { return world_; }

 private:
  int world_;
  std::barrier<> barrier_;
  std::vector<const float*> ptrs_;
};

}  // namespace moebatch
