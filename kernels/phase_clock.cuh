// Where a pipelined kernel's time goes, phase by phase: clock deltas summed per warpgroup over the
// phases of a tile, for the wgmma expert GEMMs (kernels/moe_wgmma.cu, kernels/moe_wgmma_fp8.cu)
// and the prefill attention on wgmma (kernels/attention_wgmma.cu). A diagnostic build only (cmake
// -DMOEBATCH_PHASE_CLOCKS=ON): otherwise PhaseClock is empty, its calls compile to nothing and
// the kernels are unchanged. ncu's stall sampling says which instructions wait; this says how long
// each phase of a tile takes, which is what tells a latency-bound ring (full waits) from a
// lockstep of the warpgroups (empty waits) or an exposed prologue and epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda_check.cuh"

namespace moebatch::kernels {

/// Phases of one tile of moe_wgmma, in the order a warpgroup passes them.
enum MoeWgmmaPhase : int {
  kWgmmaTile,       ///< the tile found, barriers set up, the first weight slices issued
  kWgmmaLookup,     ///< the gathered rows' ids
  kWgmmaFill,       ///< the first slices' rows issued
  kWgmmaFullWait,   ///< waiting for a slice to land
  kWgmmaMmaIssue,   ///< fences and the MMAs issued
  kWgmmaMmaWait,    ///< waiting for the previous slice's MMAs
  kWgmmaEmptyWait,  ///< waiting for the other warpgroup to release the slot to refill
  kWgmmaRefill,     ///< a slice's loads issued
  kWgmmaDrain,      ///< the last MMAs and the block barrier before the staging
  kWgmmaEpilogue,   ///< the staging (SiLU with gate+up) and the stores
  kWgmmaPhases
};
inline constexpr const char* kMoeWgmmaPhaseNames[kWgmmaPhases] = {
    "tile", "lookup", "fill", "full_wait", "mma_issue", "mma_wait", "empty_wait", "refill", "drain", "epilogue"};

/// Phases of one tile of moe_wgmma_fp8 (W8A8), per math warpgroup (the producer's are not
/// counted); a stage's two halves add to the same MMA, wait and promotion phases.
enum MoeWgmmaFp8Phase : int {
  kFp8Tile,       ///< the tile found, barriers set up, the accumulators zeroed
  kFp8FullWait,   ///< waiting for a stage to land
  kFp8MmaIssue,   ///< fences and a half's MMAs issued
  kFp8MmaWait,    ///< waiting for a half's MMAs
  kFp8Promote,    ///< a half's sums scaled into the accumulators
  kFp8Drain,      ///< the math warpgroups' barrier after the last stage
  kFp8Epilogue,   ///< SiLU·mul and quantization (gate+up) or bf16 staging, and the stores
  kFp8Phases
};
inline constexpr const char* kMoeWgmmaFp8PhaseNames[kFp8Phases] = {
    "tile", "full_wait", "mma_issue", "mma_wait", "promote", "drain", "epilogue"};

/// Phases of one row block of the prefill attention on wgmma, per warpgroup.
enum AttentionPhase : int {
  kAttnBounds,     ///< the block's geometry (the sequence's bounds loaded) and its barriers
  kAttnQ,          ///< Q copied in (and the first K/V tiles asked for, by the loaders)
  kAttnFirstTile,  ///< waiting for the first K/V tile, S(0) issued
  kAttnMmaWait,    ///< waiting for S(kt) and P·V(kt − 1)
  kAttnRefill,     ///< releasing tile kt − 1's stage; the loader waits for it and refills it
  kAttnSoftmax,    ///< mask, max, exp2, sums, P packed, O rescaled
  kAttnFullWait,   ///< waiting for tile kt + 1 to land
  kAttnIssue,      ///< P·V(kt) and S(kt + 1) issued
  kAttnEpilogue,   ///< the last MMAs, normalization, staging and stores
  kAttnPhases
};
inline constexpr const char* kAttentionPhaseNames[kAttnPhases] = {
    "bounds", "q", "first_tile", "mma_wait", "refill", "softmax", "full_wait", "issue", "epilogue"};

#if MOEBATCH_PHASE_CLOCKS
/// One thread's running phase sums (32-bit: a block's phases sum to less than 2^32 cycles); thread
/// 0 of each warpgroup adds them to the totals.
template <int kPhases>
struct PhaseClock {
  unsigned last;
  unsigned sum[kPhases] = {};
  __device__ __forceinline__ PhaseClock() : last(now()) {}
  /// Charges the cycles since the previous mark to `phase`.
  __device__ __forceinline__ void mark(int phase) {
    const unsigned t = now();
    sum[phase] += t - last;
    last = t;
  }
  /// totals [kPhases + 1]: the phase sums, then the number of warpgroup tiles summed (`tiles`
  /// of them in this warpgroup's sums: a persistent kernel's).
  __device__ __forceinline__ void flush(unsigned long long* totals, unsigned tiles = 1) const {
    if ((threadIdx.x & 127) != 0) return;
    for (int i = 0; i < kPhases; ++i) atomicAdd(&totals[i], static_cast<unsigned long long>(sum[i]));
    atomicAdd(&totals[kPhases], static_cast<unsigned long long>(tiles));
  }
  // clock() exists only in the device pass
  __device__ __forceinline__ static unsigned now() {
#ifdef __CUDA_ARCH__
    return static_cast<unsigned>(clock());
#else
    return 0;
#endif
  }
};

/// Host, in the translation unit that defines `totals` (a __device__ array its kernel flushes
/// into): the sums since the last call, then reset to zero.
template <size_t N>
std::vector<uint64_t> take_phase_totals(const unsigned long long (&totals)[N]) {
  static_assert(sizeof(uint64_t) == sizeof(unsigned long long));
  std::vector<uint64_t> out(N);
  CUDA_CHECK(cudaMemcpyFromSymbol(out.data(), totals, sizeof(totals)));
  void* dev = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(&dev, totals));
  CUDA_CHECK(cudaMemset(dev, 0, sizeof(totals)));
  return out;
}
#else
template <int kPhases>
struct PhaseClock {
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void flush(unsigned long long*, unsigned = 1) const {}
};
#endif

}  // namespace moebatch::kernels
