// The shared-memory ring of the decode GEMVs that stream weights through shared memory
// (gemv_stream.cu), for sm_90a builds (MOEBATCH_WGMMA): one
// producer thread fills kStages slots by bulk copies, kConsumers threads drain them, on mbarriers
// (kernels/wgmma.cuh).
//
// Layout from the start of dynamic shared memory: full[kStages] barriers, empty[kStages] after
// them (the first kStreamRingBarrierBytes hold both, and whatever scratch a kernel puts after
// them), then the slots. Stage q (counted from 0 over the CTA's life) uses slot q % kStages in
// phase q / kStages. full[s]: one producer arrival plus the stage's bytes; empty[s]: one arrival
// per consumer thread. Every consumer waits on every stage in order: a parity wait is only sound
// one phase ahead of the barrier, and walking every stage keeps it so.
#pragma once

#include <cstdint>

#include "kernels/cuda_check.cuh"
#include "kernels/wgmma.cuh"

namespace moebatch::kernels {

constexpr int kStreamRingBarrierBytes = 128;  // the barriers (and scratch); the slots 128-aligned after

/// Shared memory a block of the streaming kernels may opt into on `device` (the dynamic limit
/// their prepare functions set, and what their rings are sized against).
inline int stream_smem_optin(int device) {
  int bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

template <int kStages, int kConsumers>
struct StreamRing {
  static_assert(16 * kStages <= kStreamRingBarrierBytes, "the barriers fit before the ring");
  uint32_t bar0 = 0;        // shared address of full[0]
  uint32_t slot_bytes = 0;  // a multiple of 16

  // Sets the ring's barriers at the start of dynamic shared memory `smem` (the whole block meets).
  __device__ static StreamRing init(const uint8_t* smem, uint32_t slot_bytes) {
    StreamRing r;
    r.bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    r.slot_bytes = slot_bytes;
    wgmma::init_ring_barriers(r.full(0), r.empty(0), kStages, 1, kConsumers);
    return r;
  }
  __device__ uint32_t full(int q) const { return bar0 + 8 * (q % kStages); }
  __device__ uint32_t empty(int q) const { return bar0 + 8 * kStages + 8 * (q % kStages); }
  __device__ uint32_t slot(int q) const {
    return bar0 + kStreamRingBarrierBytes + (q % kStages) * slot_bytes;
  }
  // Producer: until stage q's slot is free (the stage kStages back consumed: phase
  // q / kStages - 1 of its empty barrier).
  __device__ void acquire(int q) const {
    if (q >= kStages) wgmma::mbarrier_wait(empty(q), ((q / kStages) - 1) & 1);
  }
  // Producer: copies `bytes` from `src` to shared `dst` onto stage q's full barrier (the stage's
  // bytes announced before by mbarrier_arrive_expect_tx).
  __device__ void copy(int q, uint32_t dst, const void* src, uint32_t bytes) const {
    wgmma::bulk_copy_g2s(dst, src, bytes, full(q));
  }
  // Consumers: until stage q's bytes have landed.
  __device__ void wait_full(int q) const { wgmma::mbarrier_wait(full(q), (q / kStages) & 1); }
  // Consumers: this thread is done reading stage q's slot.
  __device__ void release(int q) const { wgmma::mbarrier_arrive(empty(q)); }
};

}  // namespace moebatch::kernels
