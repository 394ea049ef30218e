// The collectives tensor-parallel ranks make, as one interface for every backend. The CPU
// backend's ranks are threads sharing host memory (engine/cpu/comm.h, InProcessComm); the CUDA
// backend's ranks are devices, where buffers are device pointers and each call is enqueued on
// the calling rank's stream (NCCL, or an in-process peer-to-peer all-reduce, chosen by size).
// Every rank makes the same calls in the same order.
#pragma once

#include <cstddef>

namespace moebatch {

/// Element type of a collective's buffers.
enum class CommDType { F32, Bf16 };

/// A stream handle as an opaque pointer (cudaStream_t on a device; null for host memory), so
/// engine headers stay free of CUDA.
using CommStream = void*;

/// Collective operations among `world()` ranks.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// Number of ranks.
  virtual int world() const = 0;
  /// In-place sum over ranks of `count` elements at `data`; every rank gets the same result.
  virtual void all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                              CommStream stream) = 0;
  /// `count` elements of every rank's `send` into `recv` [world, count] (rank r at r * count).
  virtual void all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                          CommStream stream) = 0;
};

/// Bytes of one element of `t`.
inline size_t comm_dtype_bytes(CommDType t) { return t == CommDType::F32 ? 4 : 2; }

}  // namespace moebatch
