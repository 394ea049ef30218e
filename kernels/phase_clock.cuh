// Where a pipelined kernel's time goes, phase by phase: clock64 deltas summed per warpgroup over
// the phases of the bf16 wgmma expert GEMM's k loop (kernels/moe_wgmma.cu). A diagnostic build
// only (cmake -DMOEBATCH_PHASE_CLOCKS=ON): otherwise PhaseClock is empty, its calls compile to
// nothing and the kernels are unchanged. ncu's stall sampling says which instructions wait; this
// says how long each phase of a tile takes, which is what tells a latency-bound ring (full waits)
// from a lockstep of the warpgroups (empty waits) or an exposed prologue and epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moebatch::kernels {

/// Phases of one tile of moe_wgmma, in the order a warpgroup passes them.
enum WgmmaPhase : int {
  kPhaseLookup,     ///< the tile lookup and the gathered rows' ids
  kPhaseFill,       ///< barrier setup and the first slices' loads issued
  kPhaseFullWait,   ///< waiting for a slice to land
  kPhaseMmaIssue,   ///< fences and the MMAs issued
  kPhaseMmaWait,    ///< waiting for the previous slice's MMAs
  kPhaseEmptyWait,  ///< waiting for the other warpgroup to release the slot to refill
  kPhaseRefill,     ///< a slice's loads issued
  kPhaseEpilogue,   ///< the last MMAs, the staging and the stores
  kPhaseCount
};

/// Names of the phases, for printing.
inline constexpr const char* kWgmmaPhaseNames[kPhaseCount] = {
    "lookup", "fill", "full_wait", "mma_issue", "mma_wait", "empty_wait", "refill", "epilogue"};

#if MOEBATCH_PHASE_CLOCKS
/// One thread's running phase sums; thread 0 of each warpgroup adds them to the totals.
struct PhaseClock {
  long long last;
  long long sum[kPhaseCount] = {};
  __device__ __forceinline__ PhaseClock() : last(now()) {}
  /// Charges the cycles since the previous mark to `phase`.
  __device__ __forceinline__ void mark(int phase) {
    const long long t = now();
    sum[phase] += t - last;
    last = t;
  }
  // clock64 exists only in the device pass
  __device__ __forceinline__ static long long now() {
#ifdef __CUDA_ARCH__
    return clock64();
#else
    return 0;
#endif
  }
  /// totals [kPhaseCount + 1]: the phase sums, then the number of warpgroup tiles summed.
  __device__ __forceinline__ void flush(unsigned long long* totals) const {
    if ((threadIdx.x & 127) != 0) return;
    for (int i = 0; i < kPhaseCount; ++i) atomicAdd(&totals[i], static_cast<unsigned long long>(sum[i]));
    atomicAdd(&totals[kPhaseCount], 1ull);
  }
};
#else
struct PhaseClock {
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void flush(unsigned long long*) const {}
};
#endif

}  // namespace moebatch::kernels
