// The tile-identity ring of the persistent expert GEMMs (kernels/moe_wgmma.cu,
// kernels/moe_wgmma_fp8.cu). One block per SM walks the launch's tiles w = blockIdx.x +
// i · gridDim.x (row tile w / n_tiles, column tile w % n_tiles); the producer's warp 0 finds each
// and hands it to the math warpgroups through two shared entries, step i using entry i & 1:
// tile_full[e] completes on the producer thread 0's arrival, tile_empty[e] once every math thread
// has read the entry. So the producer runs one tile ahead of the math, never two.
#pragma once

#include <cstdint>

#include "kernels/moe_tiles.cuh"
#include "kernels/wgmma.cuh"

namespace moebatch::kernels {

/// One walk step's tile as the producer hands it over.
struct TileInfo {
  MoeTile tile;
  int n_tile;
  int valid;  // 0: the walk has ended
};

/// The ring: its two entries (shared memory) and their barriers (two 8-byte mbarriers each).
struct TileRing {
  TileInfo* info;  // [2]
  uint32_t full0, empty0;

  /// Thread 0, before the block meets (init_ring_barriers' __syncthreads): tile_full counts
  /// thread 0's arrival, tile_empty every math thread's.
  __device__ __forceinline__ void init(uint32_t math_threads) const {
    for (int e = 0; e < 2; ++e) {
      wgmma::mbarrier_init(full0 + e * 8, 1);
      wgmma::mbarrier_init(empty0 + e * 8, math_threads);
    }
  }

  /// Warp 0 of the producer (find_moe_tile needs the whole warp): finds walk step i's tile and
  /// publishes it in entry i & 1 once the math warpgroups have read that entry's previous tile.
  template <int kBM>
  __device__ __forceinline__ void publish(int i, int64_t walk_len, int n_tiles,
                                          const int32_t* expert_offsets, int experts) const {
    const int e = i & 1;
    const int64_t w = blockIdx.x + static_cast<int64_t>(i) * gridDim.x;
    if (i >= 2) wgmma::mbarrier_wait(empty0 + e * 8, ((i >> 1) - 1) & 1);
    const bool found = w < walk_len && find_moe_tile<kBM>(expert_offsets, experts,
                                                           static_cast<int>(w / n_tiles), info[e].tile);
    __syncwarp();  // the hit lane's tile before lane 0's release
    if (threadIdx.x == 0) {
      info[e].n_tile = static_cast<int>(w % n_tiles);
      info[e].valid = found;
      wgmma::mbarrier_arrive(full0 + e * 8);
    }
  }

  /// Every math thread: walk step i's tile, its entry released at once.
  __device__ __forceinline__ TileInfo take(int i) const {
    const int e = i & 1;
    wgmma::mbarrier_wait(full0 + e * 8, (i >> 1) & 1);
    const TileInfo ti = info[e];
    wgmma::mbarrier_arrive(empty0 + e * 8);
    return ti;
  }
};

}  // namespace moebatch::kernels
