// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). Tiles of one expert's output — 256 rows
// × 192 columns (wide) or 128 × 256 (narrow; MoeWgmmaParams::wide_tiles) — one persistent block
// per SM walking them: two math warpgroups, each two 64-row slabs (wide) or one, share the tile's
// weight rows. k moves through a ring of 3 (wide) or 4 slots of 64-wide slices laid out with the
// 128-byte swizzle wgmma reads (kernels/wgmma.cuh). Warp-specialized, as
// kernels/moe_wgmma_fp8.cu: a producer warpgroup fills the ring — the weight tile by TMA (its
// thread 0, two 128-row boxes), the A rows by its 128 threads' cp.async (or, with
// MoeWgmmaParams::tma_rows, as one more TMA box) — and the math warpgroups only wait, multiply
// and release; each slot's arrival and release tracked by mbarriers; a slice's MMAs overlap the
// next slice's. The producer runs up to the whole ring ahead, across tiles: the next tile's
// lookup, ids and first slices go on under this tile's last slices and epilogue. Registers move
// from the producer (56) to the math warpgroups (224) with setmaxnreg. Each math warp stages its
// own 16 rows of the output in shared memory beside the ring, so that every row leaves in 16-byte
// stores. With sorted_ids the A rows come straight from the tokens' rows (the gather of the
// gate+up stage, fused). An expert's last tile of ≤ 64 rows multiplies on one warpgroup (about a
// tenth of the tiles at 8192 tokens of the 30B shape: gate+up −3%, down −2.5% in the engine,
// bench/RESULTS.md 2026-12-06).
//
// Measured and set aside (bench/RESULTS.md, 2026-12-04 and 12-05): a 9-slot ring of 32-wide
// slices, TMA prefetch of weight slices into L2, two persistent forms without a producer
// warpgroup (a block per SM walking the tiles, the ring running on into the next tile: commits
// ff0a0d5 and c3d1050; every warpgroup loaded, so nothing ran ahead under the epilogue), and
// 128-column tiles with two blocks per SM so that one block's edges run under the other's k loop
// (commit 5e4031c) — each slower. The warp-specialized form alone (not persistent) measured
// within noise (session 30; git history at 389a80d).
//
// Built for sm_90a only (MOEBATCH_WGMMA, set by kernels/CMakeLists.txt); without it the entry
// points exist and moe_wgmma_available says false.
#include "kernels/moe_wgmma.cuh"

#include <algorithm>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_tile_ring.cuh"
#include "kernels/moe_tiles.cuh"
#include "kernels/phase_clock.cuh"
#include "kernels/tensor_map.cuh"
#if MOEBATCH_WGMMA
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

constexpr int kWarpgroup = 128;
constexpr int kMathThreads = 2 * kWarpgroup;          // warpgroups 1 and 2: one slab of rows each
constexpr int kThreads = kWarpgroup + kMathThreads;   // and the producer, warpgroup 0
constexpr int kProducerBarrier = 1;  // named barrier of the producer warpgroup
// The k ring holds 64-wide slices (one 128-byte swizzled row per tile row).
constexpr int kBK = 64;
constexpr int kRowBytes = kBK * 2;
constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per tile row

// The two tile shapes (MoeWgmmaParams::wide_tiles). A tile's bytes per multiply-add from L2 are
// (BM + BN) / (BM · BN): 0.0117 for 128 × 256, 0.0091 for 256 × 192 (−22%). The kernel is
// bound by L2 bandwidth at 128 × 256 (ncu: 83.7% of L2 throughput, bench/RESULTS.md session
// 30), and the register file bounds the tile: 256 × 256 would need 256 accumulators a thread.
//   Narrow: 128 rows × 256 columns; each math warpgroup one 64-row slab (128 accumulators), a
//   ring of 4 slots of 48 KB.
//   Wide: 256 rows × 192 columns (gate+up: 96 gate and the same 96 up columns); each math
//   warpgroup two 64-row slabs (192 accumulators), a ring of 3 slots of 56 KB.
struct NarrowTile {
  static constexpr int kBM = 128, kBN = 256, kSlabs = 1, kStages = 4;
  static constexpr int kPieceCols = 64;  // output columns a warp stages at a time
  // The block starts at 168 registers a thread (65,536 / 384); the producer gives back to 56 so
  // that the math warpgroups can hold 224 (acc 128 + addressing).
  static constexpr int kProducerRegs = 56, kMathRegs = 224;
};
struct WideTile {
  static constexpr int kBM = 256, kBN = 192, kSlabs = 2, kStages = 3;
  static constexpr int kPieceCols = 96;
  static constexpr int kProducerRegs = 40, kMathRegs = 232;  // acc 192 + addressing
};

template <class Tile>
struct TileLayout {
  static constexpr int kBM = Tile::kBM, kBN = Tile::kBN, kSlabs = Tile::kSlabs, kStages = Tile::kStages;
  static constexpr int kWgRows = 64 * kSlabs;   // rows per math warpgroup
  static constexpr int kAcc = kBN / 2;          // accumulators per thread and 64-row slab
  // The producer's A copies: each thread copies kGroup adjacent 16-byte chunks of a row (wide:
  // 32 bytes, one L2 sector), kPasses rows of the tile a slice.
  static constexpr int kGroup = kBM / 128;
  static constexpr int kRowsPerPass = kWarpgroup * kGroup / kChunks;
  static constexpr int kPasses = kBM / kRowsPerPass;
  static constexpr int kATile = kBM * kRowBytes;  // bytes; multiples of 1024 keep every tile aligned
  static constexpr int kBTile = kBN * kRowBytes;
  static constexpr int kStageBytes = kATile + kBTile;  // narrow 48 KB, wide 56 KB
  static constexpr int kRingBytes = kStages * kStageBytes;
  // Output staging beside the ring, so that the producer can refill the ring for the next tile
  // while the math warpgroups write this one's: the ring leaves no room for a whole output tile,
  // so each math warp stages its own 16 rows of a slab a piece of kPieceCols columns at a time
  // (padded by 16 bytes against bank conflicts) and stores them itself: no barrier between warps.
  static constexpr int kPieceCols = Tile::kPieceCols;
  static constexpr int kPiecePitch = kPieceCols * 2 + 16;
  static constexpr int kStagingBytes = kMathThreads / 32 * 16 * kPiecePitch;
  static constexpr int kSmemBytes = kRingBytes + kStagingBytes + 1024;  // + slack to align the ring
  static_assert(kATile % 1024 == 0 && kBTile / 2 % 1024 == 0, "tiles and boxes stay aligned to the swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024 - 256, "one block's shared memory (and the static barriers)");
  static_assert(Tile::kProducerRegs + 2 * Tile::kMathRegs <= 3 * (65536 / kThreads / 8 * 8), "setmaxnreg budget");
  static_assert(kPasses * kRowsPerPass == kBM && kChunks % kGroup == 0, "the A copies cover the tile");
  static_assert((kBN / 2) % kPieceCols == 0 && kBN % kPieceCols == 0, "pieces cover a tile's output columns");
};

#if MOEBATCH_WGMMA

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile's math warpgroups since the last moe_wgmma_take_phase_clocks
// (diagnostic builds only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

/// One 64-row slab's MMAs of a 16-wide k step: d [64 × kBN] (+)= A · Bᵀ.
template <int kBN>
__device__ __forceinline__ void mma_slab(float (&d)[kBN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kBN == 256)
    wgmma::mma_m64n256k16(d, desc_a, desc_b, 1);
  else
    wgmma::mma_m64n192k16(d, desc_a, desc_b, 1);
}

// Persistent: block b takes the walk's tiles b, b + G, … (G = gridDim.x; tile w is row tile
// w / n_tiles, column tile w % n_tiles) until the row tiles end.
// kTmaRows (MoeWgmmaParams::tma_rows): A's rows come as one TMA box like the weights, rows past
// the tile's own (the next expert's, or zeros past rows_cap) only feeding output rows that are
// never stored; no thread copies anything.
template <class Tile, bool kSilu, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles, int64_t walk_len, const __grid_constant__ CUtensorMap weight_map,
                     const __grid_constant__ CUtensorMap rows_map) {
  using L = TileLayout<Tile>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kStages = L::kStages, kSlabs = L::kSlabs;
  constexpr int kATile = L::kATile, kBTile = L::kBTile, kStageBytes = L::kStageBytes;
  constexpr int kPasses = L::kPasses, kRowsPerPass = L::kRowsPerPass, kGroup = L::kGroup;
  constexpr int kPieceCols = L::kPieceCols, kPiecePitch = L::kPiecePitch, kAcc = L::kAcc;
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* staging = smem + L::kRingBytes;  // the math warps' output pieces
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // 0: the producer; 1, 2: rows [kWgRows·(wg − 1), kWgRows·wg) of a tile
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  const int kt_count = (p.k + kBK - 1) / kBK;

  // Pacing of the ring (slices numbered across the block's tiles, s = 0, 1, …; slot s % kStages):
  // full[slot] completes when a slice's copies have landed (each producer thread's cp.async
  // arrival and thread 0's for the TMA bytes; TMA rows: thread 0's alone); empty[slot] when both
  // math warpgroups are done with it (a warpgroup with no rows in a tile arrives without reading:
  // the count cannot change per tile). The tiles' identities pass through a ring of two TileInfo
  // entries (kernels/moe_tile_ring.cuh).
  __shared__ __align__(8) uint64_t bars[2 * kStages + 4];
  __shared__ TileInfo info[2];
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  const TileRing tiles_ring{info, empty0 + kStages * 8, empty0 + (kStages + 2) * 8};
  if (threadIdx.x == 0) tiles_ring.init(kMathThreads);
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kWarpgroup + 1, kMathThreads);  // and the block meets

  if (wg == 0) {
    // ---- the producer ----
    wgmma::setmaxnreg_dec<Tile::kProducerRegs>();
    // TMA rows: warp 0 finds the tiles and thread 0 loads everything. Threads that arrive on no
    // full barrier must never wait on an empty one — nothing holds the ring back for them, so it
    // could run two phases past one (a parity wait would then hang): warp 0's other lanes walk
    // the tiles with thread 0 (find_moe_tile needs the whole warp) but skip the slices, and the
    // other warps leave at once.
    if (kTmaRows && threadIdx.x >= 32) return;
    const int chunk0 = threadIdx.x % (kChunks / kGroup) * kGroup, row_in_pass = threadIdx.x / (kChunks / kGroup);
    int s = 0;  // the block's slice count
    for (int i = 0;; ++i) {
      const int e = i & 1;
      if (threadIdx.x < 32) tiles_ring.publish<kBM>(i, walk_len, n_tiles, p.expert_offsets, p.num_experts);
      // the producer reads info[e] (warp 0 alone with TMA rows)
      if constexpr (kTmaRows)
        __syncwarp();
      else
        named_barrier_sync<kProducerBarrier, kWarpgroup>();
      if (!info[e].valid) break;
      const MoeTile t = info[e].tile;
      const int n_tile = info[e].n_tile;
      if (kTmaRows && threadIdx.x != 0) continue;

      // Thread 0 brings the weight tile by TMA: two boxes of kBN / 2 rows (the gate and the up
      // rows with SiLU), and with kTmaRows the slice's rows as one more box.
      const int expert_row0 = t.expert * p.n;  // the expert's first row in the weight map
      const int box_row0 = expert_row0 + (kSilu ? n_tile * (kBN / 2) : n_tile * kBN);
      const int box_row1 = expert_row0 + (kSilu ? half + n_tile * (kBN / 2) : n_tile * kBN + kBN / 2);
      auto load_weights = [&](int kt, int slot) {
        const uint32_t bar = full0 + slot * 8, b_tile = smem_addr + slot * kStageBytes + kATile;
        wgmma::mbarrier_arrive_expect_tx(bar, kTmaRows ? kATile + kBTile : kBTile);
        if constexpr (kTmaRows) wgmma::tma_load_2d(smem_addr + slot * kStageBytes, &rows_map, kt * kBK, t.row0, bar);
        wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, box_row0, bar);
        wgmma::tma_load_2d(b_tile + kBTile / 2, &weight_map, kt * kBK, box_row1, bar);
      };
      // Slices of the ring's first lap (the block's first tile) need no slot released: their
      // weights are on their way before the rows' ids are looked up (a dependent global load of
      // its own). Later tiles' ids are looked up under the previous tile's slices.
      const int early = s < kStages ? min(kStages - s, kt_count) : 0;
      if (threadIdx.x == 0)
        for (int kt = 0; kt < early; ++kt) load_weights(kt, (s + kt) % kStages);

      // Each thread copies 16-byte chunks chunk0 .. chunk0 + kGroup - 1 of A's tile rows
      // row_in_pass + kRowsPerPass·i; a_src[i] is the row of `in` that A row i holds, -1 for zeros
      // (past the segment, padding pairs). Rows a weight box reads past the expert's own (a
      // partial last tile) only feed output columns that are never stored.
      int a_src[kPasses];
      if constexpr (!kTmaRows) {
        // every id is loaded before the first row_of_pair store, which the compiler must
        // otherwise assume may alias sorted_ids and wait for each load in turn
        int id[kPasses];
#pragma unroll
        for (int r = 0; r < kPasses; ++r) {
          const int row = row_in_pass + kRowsPerPass * r;
          id[r] = p.sorted_ids && row < t.rows ? p.sorted_ids[t.row0 + row] : -1;
        }
#pragma unroll
        for (int r = 0; r < kPasses; ++r) {
          const int row_in_tile = row_in_pass + kRowsPerPass * r, row = t.row0 + row_in_tile;
          a_src[r] = row_in_tile < t.rows ? row : -1;
          if (p.sorted_ids && row_in_tile < t.rows) {
            const bool real = id[r] >= 0 && id[r] < p.num_pairs;
            a_src[r] = real ? id[r] / p.in_row_div : -1;
            if (real && p.row_of_pair && n_tile == 0 && chunk0 == 0) p.row_of_pair[id[r]] = row;
          }
        }
      }
      for (int kt = 0; kt < kt_count; ++kt, ++s) {
        const int slot = s % kStages;
        if (kt >= early) {
          if (s >= kStages) wgmma::mbarrier_wait(empty0 + slot * 8, (s / kStages - 1) & 1);
          if (threadIdx.x == 0) load_weights(kt, slot);
        }
        if constexpr (!kTmaRows) {
          uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
          for (int r = 0; r < kPasses; ++r)
#pragma unroll
            for (int g = 0; g < kGroup; ++g) {
              const int col = kt * kBK + (chunk0 + g) * 8;
              const bool ok = col < p.k && a_src[r] >= 0;
              const bf16* src = ok ? p.in + static_cast<size_t>(a_src[r]) * p.k + col : p.in;
              cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * r, chunk0 + g), src, ok ? 16 : 0);
            }
          wgmma::cp_async_mbarrier_arrive(full0 + slot * 8);
        }
      }
    }
    if constexpr (!kTmaRows) {
      cp_async_commit();
      cp_async_wait<0>();  // leave no copy of this thread in flight
    }
    return;
  }

  // ---- the math warpgroups ----
  wgmma::setmaxnreg_inc<Tile::kMathRegs>();
  const int slab = wg - 1, math_thread = threadIdx.x - kWarpgroup;
  const int lane = threadIdx.x & 31, warp = math_thread >> 5;  // warp w: rows [16(w % 4), +16) of each of its slabs
  const int c0 = 2 * (lane & 3);  // this thread's accumulator columns 8j + c0, + 1 (kernels/wgmma.cuh)
  uint8_t* piece = staging + warp * 16 * kPiecePitch;
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? half : p.n;
  float acc[kSlabs][kAcc];
  int s = 0;  // the block's slice count, as the producer's
  unsigned tiles = 0;
  for (int i = 0;; ++i) {
    const TileInfo ti = tiles_ring.take(i);
    if (!ti.valid) break;
    const MoeTile& t = ti.tile;
    const int n_tile = ti.n_tile;
#pragma unroll
    for (int h = 0; h < kSlabs; ++h)
#pragma unroll
      for (int j = 0; j < kAcc; ++j) acc[h][j] = 0.f;
    clock.mark(kWgmmaTile);

    // This warpgroup's rows of the tile: a warpgroup whose rows lie wholly past the tile's (an
    // expert's last tile) multiplies nothing: it only releases each slice once it has landed (so
    // that its arrivals stay in that slice's phase), leaving the tensor cores to the other one.
    // Both slabs multiply even when the rows end in the first: an MMA under a condition makes
    // ptxas serialize every wgmma of the loop (C7520).
    if (t.rows > slab * L::kWgRows) {
      // Iteration kt issues slice kt's MMAs, waits for slice kt - 1's (wait<1>: kt's may still
      // run) and releases that slot; the last slice's after the loop.
      for (int kt = 0; kt < kt_count; ++kt, ++s) {
        const int slot = s % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (s / kStages) & 1);
        clock.mark(kWgmmaFullWait);
        // A's copies were made by the generic proxy; the tensor cores read through the async one
        if constexpr (!kTmaRows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // A 16-wide k step is 32 bytes on in both tiles, the second slab's rows 8 KB on: added to
        // the descriptors' address field (16-byte units; shared addresses never carry out of it),
        // so that no descriptor is formed per MMA.
        const uint64_t desc_a = wgmma::smem_desc_sw128(smem_addr + slot * kStageBytes + slab * (kATile / 2));
        const uint64_t desc_b = wgmma::smem_desc_sw128(smem_addr + slot * kStageBytes + kATile);
#pragma unroll
        for (int h = 0; h < kSlabs; ++h)
#pragma unroll
          for (int j = 0; j < kAcc; ++j) wgmma::fence_operand(acc[h][j]);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          mma_slab<kBN>(acc[0], desc_a + kk * (32 >> 4), desc_b + kk * (32 >> 4));
          if constexpr (kSlabs == 2)
            mma_slab<kBN>(acc[1], desc_a + (64 * kRowBytes + kk * 32) / 16, desc_b + kk * (32 >> 4));
        }
        wgmma::commit();
        clock.mark(kWgmmaMmaIssue);
#pragma unroll
        for (int h = 0; h < kSlabs; ++h)
#pragma unroll
          for (int j = 0; j < kAcc; ++j) wgmma::fence_operand(acc[h][j]);
        wgmma::wait<1>();
        clock.mark(kWgmmaMmaWait);
        if (kt > 0) wgmma::mbarrier_arrive(empty0 + ((s - 1) % kStages) * 8);
      }
      wgmma::wait<0>();
#pragma unroll
      for (int h = 0; h < kSlabs; ++h)
#pragma unroll
        for (int j = 0; j < kAcc; ++j) wgmma::fence_operand(acc[h][j]);
      wgmma::mbarrier_arrive(empty0 + ((s - 1) % kStages) * 8);
      clock.mark(kWgmmaDrain);
    } else {
      for (int kt = 0; kt < kt_count; ++kt, ++s) {
        const int slot = s % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (s / kStages) & 1);
        wgmma::mbarrier_arrive(empty0 + slot * 8);
      }
      clock.mark(kWgmmaFullWait);
    }

    // Accumulators → bf16 (silu(gate)·up with SiLU), a kPieceCols-column piece of the warp's 16
    // rows at a time through its staging, then 16-byte row chunks out. Gate+up's columns past
    // `half` (a partial last tile) hold what the gate box read past the gate rows: never stored.
    // A warp whose rows all lie past the tile's has nothing to store.
    const int col0_bytes = n_tile * tile_cols * 2, out_bytes = out_cols * 2;
#pragma unroll
    for (int h = 0; h < kSlabs; ++h) {
      const int row0 = slab * L::kWgRows + 64 * h + 16 * (warp & 3);  // the warp's first row in the tile
      if (row0 >= t.rows) continue;
#pragma unroll
      for (int q = 0; q < tile_cols / kPieceCols; ++q) {
#pragma unroll
        for (int j = 0; j < kPieceCols / 8; ++j) {
          const int a = 4 * (kPieceCols / 8 * q + j);  // accumulators of columns kPieceCols·q + 8j + c0, + 1
          __nv_bfloat162 v0, v1;                        // rows lane / 4 and lane / 4 + 8 of the warp's
          const float* d = acc[h];
          if constexpr (kSilu) {
            const int u = a + 4 * (kBN / 16);  // the up columns' accumulators
            v0 = __floats2bfloat162_rn(silu_fast(d[a]) * d[u], silu_fast(d[a + 1]) * d[u + 1]);
            v1 = __floats2bfloat162_rn(silu_fast(d[a + 2]) * d[u + 2], silu_fast(d[a + 3]) * d[u + 3]);
          } else {
            v0 = __floats2bfloat162_rn(d[a], d[a + 1]);
            v1 = __floats2bfloat162_rn(d[a + 2], d[a + 3]);
          }
          *reinterpret_cast<__nv_bfloat162*>(&piece[(lane >> 2) * kPiecePitch + (8 * j + c0) * 2]) = v0;
          *reinterpret_cast<__nv_bfloat162*>(&piece[((lane >> 2) + 8) * kPiecePitch + (8 * j + c0) * 2]) = v1;
        }
        __syncwarp();
        // 16 rows × kPieceCols / 8 chunks of 16 bytes
        // (the wide tile's 6 a lane one at a time: unrolled, their addresses spill at 232 registers)
        constexpr int kPieceChunks = kPieceCols / 8, kLaneChunks = 16 * kPieceChunks / 32;
        constexpr int kStoreUnroll = kSlabs == 1 ? kLaneChunks : 1;
#pragma unroll kStoreUnroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const int chunk = lane + 32 * c, row = chunk / kPieceChunks, cc = chunk % kPieceChunks;
          const int col_bytes = col0_bytes + q * kPieceCols * 2 + cc * 16;
          if (row0 + row < t.rows && col_bytes < out_bytes)
            *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.out) +
                                      static_cast<size_t>(t.row0 + row0 + row) * out_bytes + col_bytes) =
                *reinterpret_cast<const uint4*>(&piece[row * kPiecePitch + cc * 16]);
        }
        __syncwarp();  // read before the next piece (or tile) overwrites it
      }
    }
    clock.mark(kWgmmaEpilogue);
    ++tiles;
  }
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_phase_totals, tiles);
#else
  (void)tiles;
#endif
}

template <class Tile, bool kSilu, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  constexpr int kBM = Tile::kBM, kBN = Tile::kBN;
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t walk_len = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma: too many weight rows");
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // one per SM: the kernel is persistent
  const int blocks = static_cast<int>(std::min<int64_t>(p.max_blocks > 0 ? std::min(sms, p.max_blocks) : sms, walk_len));
  const CUtensorMap map =
      tensor_map_2d(p.weight, TmaElement::Bf16, static_cast<int64_t>(p.num_experts) * p.n, p.k, kBN / 2);
  // without TMA rows the kernel never reads its rows map: the weights' stands in
  const CUtensorMap rows = kTmaRows ? tensor_map_2d(p.in, TmaElement::Bf16, p.rows_cap, p.k, kBM) : map;
  moe_wgmma_kernel<Tile, kSilu, kTmaRows>
      <<<blocks, kThreads, TileLayout<Tile>::kSmemBytes, stream>>>(p, n_tiles, walk_len, map, rows);
  CUDA_CHECK_LAST();
}

template <class Tile>
void raise_smem_limits() {
  for (const auto kernel : {moe_wgmma_kernel<Tile, true, false>, moe_wgmma_kernel<Tile, false, false>,
                            moe_wgmma_kernel<Tile, true, true>, moe_wgmma_kernel<Tile, false, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    TileLayout<Tile>::kSmemBytes));
}

template <class Tile>
void launch_tile(const MoeWgmmaParams& p, cudaStream_t stream) {
  if (p.silu_gate_up)
    p.tma_rows ? launch<Tile, true, true>(p, stream) : launch<Tile, true, false>(p, stream);
  else
    p.tma_rows ? launch<Tile, false, true>(p, stream) : launch<Tile, false, false>(p, stream);
}

#endif  // MOEBATCH_WGMMA

}  // namespace

void moe_wgmma_prepare() {
#if MOEBATCH_WGMMA
  raise_smem_limits<NarrowTile>();
  raise_smem_limits<WideTile>();
  detail::moe_wgmma_fp8_prepare();
  detail::moe_gemm_tma_prepare();
#endif
}

std::vector<uint64_t> moe_wgmma_take_phase_clocks() {
#if MOEBATCH_WGMMA && MOEBATCH_PHASE_CLOCKS
  return take_phase_totals(g_phase_totals);
#else
  return {};
#endif
}

bool moe_wgmma_available(int device) {
#if MOEBATCH_WGMMA
  return is_sm90_device(device);
#else
  (void)device;
  return false;
#endif
}

void moe_wgmma(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = p.silu_gate_up ? p.n / 2 : p.n;
  MB_CHECK(p.num_experts > 0 && p.n > 0 && p.k > 0 && p.rows_cap >= 0, "moe_wgmma: bad shape");
  MB_CHECK(out_cols % 8 == 0 && p.k % 8 == 0 && (!p.silu_gate_up || p.n % 2 == 0),
           "moe_wgmma: output columns and k must be multiples of 8");
  MB_CHECK(p.out && p.in && p.weight && p.expert_offsets, "moe_wgmma: null operand");
  MB_CHECK(!p.sorted_ids || (p.num_pairs >= 0 && p.in_row_div > 0), "moe_wgmma: bad gather");
  MB_CHECK(!p.tma_rows || !p.sorted_ids, "moe_wgmma: rows by TMA must be in sorted order already (no gather)");
  MB_CHECK(aligned16(p.out) && aligned16(p.in) && aligned16(p.weight), "moe_wgmma: operands must be 16-byte aligned");
  if (p.rows_cap == 0) return;
#if MOEBATCH_WGMMA
  p.wide_tiles ? launch_tile<WideTile>(p, stream) : launch_tile<NarrowTile>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_wgmma: this build has no sm_90a code (see moe_wgmma_available)");
#endif
}

}  // namespace moebatch::kernels
