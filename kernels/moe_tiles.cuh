// Row tiles of the sorted-order expert GEMMs (kernels/moe_wgmma.cu, kernels/moe_wgmma_fp8.cu):
// every expert's rows of moe_align's sorted order cut into tiles of kBM rows, numbered in expert
// order, found by each block on the device from the align's offsets (nothing comes to the host,
// so a launch sized for the worst case is capturable).
#pragma once

#include <cstdint>

namespace moebatch::kernels {

/// Row tile m of a launch: expert `expert`'s rows [row0, row0 + rows), rows ≤ the tile height.
struct MoeTile {
  int expert, row0, rows;
};

/// Warp 0 only: the m-th row tile when every expert's rows are cut into ceil(rows / kBM) tiles in
/// expert order; false past the last one. 32 experts per step: tile counts, a warp scan, a ballot.
template <int kBM>
__device__ bool find_moe_tile(const int32_t* off, int experts, int m, MoeTile& tile) {
  const int lane = threadIdx.x & 31;
  int before = 0;  // tiles of the experts of earlier steps
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int row0 = e < experts ? off[e] : 0;
    const int rows = e < experts ? off[e + 1] - row0 : 0;
    const int tiles = rows > 0 ? (rows + kBM - 1) / kBM : 0;
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(~0u, incl, d);
      if (lane >= d) incl += v;
    }
    const int start = before + incl - tiles;
    const unsigned hit = __ballot_sync(~0u, m >= start && m < start + tiles);
    if (hit != 0) {
      if (lane == __ffs(hit) - 1) {
        const int local = (m - start) * kBM;
        tile = {e, row0 + local, min(kBM, rows - local)};
      }
      return true;
    }
    before += __shfl_sync(~0u, incl, 31);
  }
  return false;
}

/// Row tiles a launch over `rows_cap` sorted rows and `experts` experts must cover:
/// Σ ceil(rows_e / kBM) ≤ rows / kBM + experts (blocks past the last tile exit).
constexpr int64_t moe_row_tiles_bound(int64_t rows_cap, int experts, int bm) {
  return rows_cap / bm + experts + 1;
}

}  // namespace moebatch::kernels
