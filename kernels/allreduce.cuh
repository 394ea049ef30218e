// In-process all-reduce for tensor-parallel decode: the ranks are threads of one process, rank r
// owning devices[r], peer access enabled between every pair, so a kernel stores straight into a
// peer's memory. One-shot push: each rank writes its partial into every peer's receive slot, one
// flag barrier per launch, then each rank sums all partials in rank order (every rank gets
// bitwise the same result). Graph-capturable: the launch epoch lives in device memory and the
// kernel advances it, so a replayed graph needs no host update. For large messages callers use
// NCCL (workspace.fits(bytes) says which). Protocol and memory-ordering argument:
// kernels/allreduce.cu; measurements: docs/kernels.md.
//
// Contract for every call on one workspace: all ranks make the same calls (same op, same shape)
// in the same order, each on its own device (current when calling) and stream-ordered per rank
// (one stream, or a captured graph of it). A rank whose peers never arrive waits until abort():
// the waiting kernels then return with undefined results and the workspace is spent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/rmsnorm.cuh"
#include "kernels/types.cuh"

namespace moebatch::kernels {

constexpr int kAllReduceMaxWorld = 8;
/// Grid limit: every block of a launch must be resident at once (blocks spin on peers).
constexpr int kAllReduceMaxBlocks = 128;
/// allreduce_add_rmsnorm keeps a row in registers: cols <= 512 threads * 4 vectors * 8.
constexpr int kAllReduceMaxCols = 16384;

/// What one rank's kernels see of the group (device pointers; peers' through peer access).
struct AllReduceRankView {
  bf16* recv[kAllReduceMaxWorld] = {};       ///< rank q's slots [2 parities][world][slot_elems]
  uint64_t* flags[kAllReduceMaxWorld] = {};  ///< rank q's flags [max blocks][max world]
  uint64_t* epochs = nullptr;  ///< this rank's launch counters [max blocks], all equal
  const volatile uint32_t* abort = nullptr;  ///< pinned host word, mapped: nonzero = give up
  size_t slot_elems = 0;       ///< bf16 elements per slot (>= max_bytes / 2)
  int rank = 0;
  int world = 0;
  int max_blocks = 0;  ///< min(kAllReduceMaxBlocks, SMs of the smallest device)
};

/// The buffers of one group of ranks, set up once (constructor) and torn down by the destructor.
/// Immutable after construction: rank threads may call the ops concurrently.
class AllReduceWorkspace {
 public:
  /// Rank r runs on devices[r] (2..8 distinct devices, each pair peer-capable). Enables peer
  /// access both ways (already enabled is fine; teardown leaves it on), allocates on each device
  /// receive slots for messages up to `max_bytes` plus zeroed flags and epochs. Restores the
  /// caller's current device.
  AllReduceWorkspace(const std::vector<int>& devices, size_t max_bytes);
  /// Frees the buffers. No call on the workspace may still be in flight on any device.
  ~AllReduceWorkspace();
  AllReduceWorkspace(const AllReduceWorkspace&) = delete;
  AllReduceWorkspace& operator=(const AllReduceWorkspace&) = delete;

  int world() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  size_t max_bytes() const { return max_bytes_; }
  /// Whether a message of `bytes` goes through this workspace (else the caller uses NCCL).
  bool fits(size_t bytes) const { return bytes <= max_bytes_; }
  const AllReduceRankView& view(int rank) const { return views_.at(rank); }
  /// Makes every launch waiting for a peer return (results undefined) and every later call
  /// throw: the ranks' epochs no longer agree, so the workspace cannot be used again. For a
  /// watchdog thread, concurrently with the ranks' calls.
  void abort() noexcept;
  bool aborted() const noexcept { return *abort_ != 0; }
  /// Device memory one rank's share takes (for the engine's per-device memory plan).
  static size_t bytes_per_device(int world, size_t max_bytes);

 private:
  void release() noexcept;

  std::vector<int> devices_;
  std::vector<void*> allocs_;  ///< one allocation per rank, on its device
  volatile uint32_t* abort_ = nullptr;  ///< pinned, mapped into every device (portable)
  std::vector<AllReduceRankView> views_;
  size_t max_bytes_ = 0;
};

/// Operands of allreduce_sum on one rank.
struct AllReduceParams {
  bf16* out = nullptr;       ///< [count] the sum over ranks; may alias `in`
  const bf16* in = nullptr;  ///< [count] this rank's partial
  size_t count = 0;          ///< multiple of 8, count * 2 <= max_bytes; the same on every rank
};

/// out = bf16(Σ_q in_q), summed in fp32 in rank order 0..world-1 (bitwise equal on all ranks).
void allreduce_sum(const AllReduceWorkspace& ws, int rank, const AllReduceParams& p,
                   cudaStream_t stream);

/// The all-reduce fused with the residual add and RMSNorm after it, one launch: with
/// s = bf16(Σ_q in_q) as allreduce_sum computes it, residual = bf16(residual + s) in place and
/// out = rmsnorm(residual) * weight — the same rounding as allreduce_sum followed by
/// add_rmsnorm (kernels/rmsnorm.cuh). `p.in` is this rank's partial [rows, cols]; `residual`
/// and `weight` hold the same values on every rank (the replicated residual stream); out may
/// alias in. cols % 8 == 0, cols <= kAllReduceMaxCols, rows * cols * 2 <= max_bytes.
void allreduce_add_rmsnorm(const AllReduceWorkspace& ws, int rank, const RmsNormParams& p,
                           cudaStream_t stream);

}  // namespace moebatch::kernels
