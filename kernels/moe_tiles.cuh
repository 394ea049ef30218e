// Row tiles of the sorted-order expert GEMMs (kernels/moe_wgmma.cu, kernels/moe_wgmma_fp8.cu):
// every expert's rows of moe_align's sorted order cut into tiles of kBM rows, numbered in expert
// order, found by each block on the device from the align's offsets (nothing comes to the host,
// so a launch sized for the worst case is capturable).
#pragma once

#include <cstdint>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Row tile m of a launch: expert `expert`'s rows [row0, row0 + rows), rows ≤ the tile height.
struct MoeTile {
  int expert, row0, rows;
};

/// Warp 0 only: the m-th row tile when every expert's rows are cut into ceil(rows / kBM) tiles in
/// expert order; false past the last one. 32 experts per step: tile counts, a warp scan, a
/// ballot. The offsets of four steps are loaded before the first scan, not one step's after the
/// other's: a block can load nothing before this, and one round trip instead of four took 1–4%
/// off the expert GEMMs (bench/RESULTS.md, 2026-12-03 session 12).
template <int kBM>
__device__ bool find_moe_tile(const int32_t* off, int experts, int m, MoeTile& tile) {
  constexpr int kSteps = 4;
  const int lane = threadIdx.x & 31;
  int before = 0;  // tiles of the experts of earlier steps
  for (int base = 0; base < experts; base += 32 * kSteps) {
    int lo[kSteps], hi[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int e = base + 32 * u + lane;
      lo[u] = e < experts ? off[e] : 0;
      hi[u] = e < experts ? off[e + 1] : 0;
    }
    // the first step with a hit decides (a ballot: the same for the whole warp)
    unsigned hit = 0;
    int hit_start = 0, hit_row0 = 0, hit_rows = 0, hit_expert = 0;
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int rows = hi[u] - lo[u];
      const int tiles = rows > 0 ? (rows + kBM - 1) / kBM : 0;
      int incl = tiles;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(~0u, incl, d);
        if (lane >= d) incl += v;
      }
      const int start = before + incl - tiles;
      const unsigned h = __ballot_sync(~0u, m >= start && m < start + tiles);
      if (hit == 0 && h != 0) {
        hit = h;
        hit_start = start;
        hit_row0 = lo[u];
        hit_rows = rows;
        hit_expert = base + 32 * u + lane;
      }
      before += __shfl_sync(~0u, incl, 31);
    }
    if (hit != 0) {
      if (lane == __ffs(hit) - 1) {
        const int local = (m - hit_start) * kBM;
        tile = {hit_expert, hit_row0 + local, min(kBM, hit_rows - local)};
      }
      return true;
    }
  }
  return false;
}

/// Every thread of the block: the block's row tile m (find_moe_tile on warp 0, handed to all
/// through shared memory); false past the last one, the same for every thread.
template <int kBM>
__device__ bool block_moe_tile(const int32_t* off, int experts, int m, MoeTile& t) {
  __shared__ MoeTile tile;
  __shared__ int found;
  if (threadIdx.x < 32) {
    const bool f = find_moe_tile<kBM>(off, experts, m, tile);
    if (threadIdx.x == 0) found = f;
  }
  __syncthreads();
  t = tile;
  return found != 0;
}

/// Accumulators of a 64 × 256 wgmma slab (kernels/wgmma.cuh layout; this thread's rows r and
/// r + 8, columns 8j + c and 8j + c + 1) rounded to bf16 into a shared-memory tile of `pitch`
/// elements per row.
__device__ __forceinline__ void stage_bf16_slab(const float (&acc)[128], bf16* tile, int pitch, int r, int c) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<__nv_bfloat162*>(&tile[r * pitch + 8 * j + c]) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(&tile[(r + 8) * pitch + 8 * j + c]) =
        __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

/// kThreads threads (`thread` = 0..kThreads-1): a staged output tile (shared memory, `pitch` bytes
/// per row) to rows [row0, row0 + rows) of `out` (`out_pitch` bytes per row), bytes
/// [col0, col0 + tile_bytes) of each, 16 bytes per store; bytes at or past `out_bytes` (the row's
/// width) are not written.
template <int kRows, int kThreads>
__device__ void store_tile(const uint8_t* tile, int pitch, uint8_t* out, size_t out_pitch, int row0, int rows,
                           int col0, int tile_bytes, int out_bytes, int thread) {
  const int chunks = tile_bytes / 16;
  for (int i = thread; i < kRows * chunks; i += kThreads) {
    const int row = i / chunks, col = (i % chunks) * 16;
    if (row < rows && col0 + col < out_bytes)
      *reinterpret_cast<uint4*>(out + static_cast<size_t>(row0 + row) * out_pitch + col0 + col) =
          *reinterpret_cast<const uint4*>(tile + row * pitch + col);
  }
}

/// Row tiles a launch over `rows_cap` sorted rows and `experts` experts must cover:
/// Σ ceil(rows_e / kBM) ≤ rows / kBM + experts (blocks past the last tile exit).
constexpr int64_t moe_row_tiles_bound(int64_t rows_cap, int experts, int bm) {
  return rows_cap / bm + experts + 1;
}

}  // namespace moebatch::kernels
