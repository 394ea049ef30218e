// The communicator the CUDA backend owns for its tensor-parallel ranks: NCCL
// (engine/cuda/nccl_comm.h) for every collective, and for bf16 all-reduces up to a size the
// in-process peer-to-peer all-reduce (kernels/allreduce.cuh), which the forward also calls fused
// with the residual add + RMSNorm that follows every all-reduce (engine/cuda/forward.cpp). Ranks
// of one process share an address space, so a decode-sized all-reduce is one kernel that stores
// into the peers' memory: 4.0 µs fused at batch 1 on 2×H200 against NCCL's 5.9 µs plus a
// separate norm (bench/RESULTS.md, "Collectives"). Aborting aborts both halves, so a rank
// waiting for a peer in either returns. Built only with NCCL (MOEBATCH_HAVE_NCCL).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "engine/cuda/comm_watchdog.h"
#include "engine/cuda/nccl_comm.h"
#include "kernels/allreduce.cuh"

namespace moebatch {

/// NCCL plus the peer-to-peer all-reduce among the ranks of one process. Thread contract as
/// NcclComm's.
class TpComm final : public Communicator, public AbortableComm {
 public:
  /// NCCL over `devices`; with p2p_max_bytes > 0, 2..8 ranks and every pair of devices
  /// peer-capable, also the peer-to-peer workspace for all-reduces of up to p2p_max_bytes
  /// (otherwise NCCL carries everything, and the log says why).
  TpComm(const std::vector<int>& devices, size_t p2p_max_bytes);
  ~TpComm() override;
  TpComm(const TpComm&) = delete;
  TpComm& operator=(const TpComm&) = delete;

  /// The peer-to-peer workspace; null when NCCL carries every all-reduce.
  const kernels::AllReduceWorkspace* p2p() const { return p2p_.get(); }
  /// Device memory the peer-to-peer workspace takes per rank (0 when it would not be created).
  static size_t p2p_bytes_per_device(int world, size_t p2p_max_bytes);

  int world() const override { return nccl_->world(); }
  /// bf16 messages that fit the peer-to-peer workspace go through it, all others through NCCL.
  void all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                      CommStream stream) override;
  void all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                  CommStream stream) override;

  std::string async_error() override { return nccl_->async_error(); }
  /// Releases the peer-to-peer waits first (never blocks), then aborts NCCL.
  void abort(const std::string& reason) override;
  bool aborted() const override { return nccl_->aborted(); }
  std::string abort_reason() const override { return nccl_->abort_reason(); }

 private:
  std::unique_ptr<NcclComm> nccl_;
  std::unique_ptr<kernels::AllReduceWorkspace> p2p_;
};

}  // namespace moebatch
