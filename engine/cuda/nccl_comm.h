// The NCCL communicator of the CUDA backend's tensor-parallel ranks: one process, one GPU per
// rank, one ncclComm_t per rank created together (ncclCommInitAll). Each collective is enqueued
// on the calling rank's stream, so it can be captured into that rank's decode graphs. The
// watchdog (engine/cuda/comm_watchdog.h) polls it for asynchronous errors and aborts it when a
// step hangs. Built only with NCCL (MOEBATCH_HAVE_NCCL); this header needs no nccl.h.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "engine/cuda/comm_watchdog.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace moebatch {

/// NCCL collectives among the ranks of one process. Thread contract: rank r's collectives come
/// from one thread at a time (rank r's thread) with rank r's device current; async_error and
/// abort come from the watchdog's thread; the destructor runs after every captured graph and
/// in-flight collective is gone and the watchdog has stopped.
class NcclComm final : public Communicator, public AbortableComm {
 public:
  /// Rank r on CUDA device devices[r] (distinct ordinals). Error with NCCL's message on failure.
  explicit NcclComm(const std::vector<int>& devices);
  /// Destroys the communicators (ncclCommDestroy; ncclCommAbort when a rank reported an
  /// asynchronous error; nothing when abort() already released them).
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int world() const override { return static_cast<int>(comms_.size()); }
  /// In-place ncclAllReduce (sum) on `stream` (a cudaStream_t of rank's device). bf16 sums are
  /// computed in fp32 and rounded once per step of NCCL's algorithm (once with 2 ranks).
  void all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                      CommStream stream) override;
  /// ncclAllGather: recv [world, count], rank r's `count` elements at r * count.
  void all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                  CommStream stream) override;

  std::string async_error() override;
  /// Marks the clique aborted (every later call throws Error(reason)), waits up to 2 s for ranks
  /// still inside an NCCL call to leave it, then ncclCommAbort on every rank: kernels waiting for
  /// a peer exit and blocked host calls return. NCCL frees the clique once the graphs that
  /// captured its collectives are destroyed, and blocks until then.
  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(); }
  std::string abort_reason() const override;

 private:
  class Call;  // a rank inside an NCCL call
  // Throws for a failed collective: the abort reason when aborted, else NCCL's message.
  void check(int rank, int result, const char* what) const;

  std::vector<ncclComm*> comms_;                 // [world]
  std::unique_ptr<std::atomic<int>[]> in_call_;  // [world] rank r is inside an NCCL call
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // guards reason_
  std::string reason_;
};

}  // namespace moebatch
