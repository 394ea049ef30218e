// In-process communicator for tensor-parallel ranks running as threads of one process, sharing
// host memory (fp32). It implements the same Communicator interface as the device
// communicators, so the sharding math is tested on CPU-only CI machines.
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/comm.h"

namespace moebatch {

/// Barrier-synchronized collectives among `world` threads (F32 only; streams are ignored).
class InProcessComm final : public Communicator {
 public:
  /// world >= 1 ranks.
  explicit InProcessComm(int world);

  int world() const override { return world_; }
  /// Sums ranks in rank order, so every rank holds bitwise the same result.
  void all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                      CommStream stream) override;
  void all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                  CommStream stream) override;

 private:
  int world_;
  std::barrier<> barrier_;
  std::vector<const float*> ptrs_;
};

}  // namespace moebatch
