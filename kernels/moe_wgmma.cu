// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). Tiles of 128 rows × 256 columns of one
// expert's output, one persistent block per SM walking them: two math warpgroups, each a 64-row
// slab, share the 256 weight rows. k moves through a ring of 4 slots of 64-wide slices laid out
// with the 128-byte swizzle wgmma reads (kernels/wgmma.cuh). Warp-specialized, as
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
// within noise (session 30; git history at 389a80d). Fewer L2 bytes per multiply-add lost each
// time: B shared by 2-CTA clusters (sessions 30 and 32: +65%, then +7%), and 256 × 192 tiles
// (session 32, commit 1947e87: gate+up with gather +33%, down +31%, down with TMA rows −2%).
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

constexpr int kBM = 128;  // rows per tile: one 64-row slab per math warpgroup
constexpr int kBN = 256;  // weight rows per tile (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kWarpgroup = 128;
constexpr int kMathThreads = 2 * kWarpgroup;          // warpgroups 1 and 2: one 64-row slab each
constexpr int kThreads = kWarpgroup + kMathThreads;   // and the producer, warpgroup 0
// The block starts at 168 registers a thread (65,536 / 384); the producer gives back to 56 so
// that the math warpgroups can hold 224 (acc 128 + addressing).
constexpr int kProducerRegs = 56, kMathRegs = 224;
static_assert(kProducerRegs + 2 * kMathRegs <= 3 * (65536 / kThreads / 8 * 8), "setmaxnreg budget");
constexpr int kProducerBarrier = 1;  // named barrier of the producer warpgroup

// The k ring: 64-wide slices (one 128-byte swizzled row per tile row) in 4 slots — one computing,
// one whose MMAs are retiring, the rest landing.
constexpr int kBK = 64, kStages = 4;
constexpr int kRowBytes = kBK * 2;
constexpr int kChunks = kRowBytes / 16;             // 16-byte chunks per tile row
constexpr int kRowsPerPass = kWarpgroup / kChunks;  // A rows one cp.async of each producer thread covers
constexpr int kPasses = kBM / kRowsPerPass;
constexpr int kATile = kBM * kRowBytes;             // bytes; multiples of 1024 keep every tile aligned
constexpr int kBTile = kBN * kRowBytes;
constexpr int kStageBytes = kATile + kBTile;        // 48 KB
constexpr int kRingBytes = kStages * kStageBytes;   // 192 KB
// Output staging beside the ring, so that the producer can refill the ring for the next tile
// while the math warpgroups write this one's. The ring and the 1 KB alignment slack leave 34 KB
// of a block's 227: down's 128 × 256 bf16 tile (64 KB) does not fit, and gate+up's 128 × 128
// (32 KB, 34 KB with the rows padded against bank conflicts) would only unpadded and then needs
// both math warpgroups to meet twice a tile. Instead each math warp stages its own 16 rows a
// 64-column quarter at a time (2.25 KB a warp, 18 KB in all; 2 quarters a gate+up tile, 4 a down
// tile) and stores them itself: no barrier between warps, as moe_wgmma_fp8's down stage.
constexpr int kQuarterCols = 64;
constexpr int kQuarterPitch = kQuarterCols * 2 + 16;  // bytes: 64 bf16 columns and 16 of padding
constexpr int kStagingBytes = kMathThreads / 32 * 16 * kQuarterPitch;
constexpr int kSmemBytes = kRingBytes + kStagingBytes + 1024;  // + slack to align the ring to 1024
static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "tiles stay aligned to the swizzle atoms");
static_assert(kSmemBytes <= 227 * 1024 - 256, "one block's shared memory (and the static barriers)");

#if MOEBATCH_WGMMA

/// One tile of a block's walk, handed from the producer to the math warpgroups.
#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile's math warpgroups since the last moe_wgmma_take_phase_clocks
// (diagnostic builds only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

// Persistent: block b takes the walk's tiles b, b + G, … (G = gridDim.x; tile w is row tile
// w / n_tiles, column tile w % n_tiles) until the row tiles end.
// kTmaRows (MoeWgmmaParams::tma_rows): A's 128 rows come as one TMA box like the weights, rows
// past the tile's own (the next expert's, or zeros past rows_cap) only feeding output rows that
// are never stored; no thread copies anything.
template <bool kSilu, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles, int64_t walk_len, const __grid_constant__ CUtensorMap weight_map,
                     const __grid_constant__ CUtensorMap rows_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* staging = smem + kRingBytes;  // the math warps' output quarters
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // 0: the producer; 1, 2: rows [64·(wg − 1), 64·wg) of a tile
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
    wgmma::setmaxnreg_dec<kProducerRegs>();
    // TMA rows: warp 0 finds the tiles and thread 0 loads everything. Threads that arrive on no
    // full barrier must never wait on an empty one — nothing holds the ring back for them, so it
    // could run two phases past one (a parity wait would then hang): warp 0's other lanes walk
    // the tiles with thread 0 (find_moe_tile needs the whole warp) but skip the slices, and the
    // other warps leave at once.
    if (kTmaRows && threadIdx.x >= 32) return;
    const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;
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

      // Thread 0 brings the weight tile by TMA: two boxes of 128 rows (the gate and the up rows
      // with SiLU), and with kTmaRows the slice's rows as one more box.
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

      // Each thread copies 16-byte chunk `chunk` of A's tile rows row_in_pass + kRowsPerPass·i;
      // a_src[i] is the row of `in` that A row i holds, -1 for zeros (past the segment, padding
      // pairs). Rows a weight box reads past the expert's own (a partial last tile) only feed
      // output columns that are never stored.
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
            if (real && p.row_of_pair && n_tile == 0 && chunk == 0) p.row_of_pair[id[r]] = row;
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
          const int col = kt * kBK + chunk * 8;
          uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
          for (int r = 0; r < kPasses; ++r) {
            const bool ok = col < p.k && a_src[r] >= 0;
            const bf16* src = ok ? p.in + static_cast<size_t>(a_src[r]) * p.k + col : p.in;
            cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * r, chunk), src, ok ? 16 : 0);
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
  wgmma::setmaxnreg_inc<kMathRegs>();
  const int slab = wg - 1, math_thread = threadIdx.x - kWarpgroup;
  const int lane = threadIdx.x & 31, warp = math_thread >> 5;  // warp w: tile rows [16w, 16w + 16)
  const int c0 = 2 * (lane & 3);  // this thread's accumulator columns 8j + c0, + 1 (kernels/wgmma.cuh)
  uint8_t* quarter = staging + warp * 16 * kQuarterPitch;
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? half : p.n;
  float acc[128];
  int s = 0;  // the block's slice count, as the producer's
  unsigned tiles = 0;
  for (int i = 0;; ++i) {
    const TileInfo ti = tiles_ring.take(i);
    if (!ti.valid) break;
    const MoeTile& t = ti.tile;
    const int n_tile = ti.n_tile;
#pragma unroll
    for (int j = 0; j < 128; ++j) acc[j] = 0.f;
    clock.mark(kWgmmaTile);

    // A math warpgroup whose 64-row slab lies wholly past the tile's rows (an expert's last tile
    // of ≤ 64 rows) multiplies nothing: it only releases each slice once it has landed (so that
    // its arrivals stay in that slice's phase), leaving the tensor cores to the other warpgroup.
    if (slab * (kBM / 2) < t.rows) {
      // Iteration kt issues slice kt's MMAs, waits for slice kt - 1's (wait<1>: kt's may still
      // run) and releases that slot; the last slice's after the loop.
      for (int kt = 0; kt < kt_count; ++kt, ++s) {
        const int slot = s % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (s / kStages) & 1);
        clock.mark(kWgmmaFullWait);
        // A's copies were made by the generic proxy; the tensor cores read through the async one
        if constexpr (!kTmaRows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const uint32_t a_addr = smem_addr + slot * kStageBytes + slab * (kATile / 2);
        const uint32_t b_addr = smem_addr + slot * kStageBytes + kATile;
#pragma unroll
        for (int j = 0; j < 128; ++j) wgmma::fence_operand(acc[j]);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wgmma::mma_m64n256k16(acc, wgmma::smem_desc_sw128(a_addr + kk * 32),
                                wgmma::smem_desc_sw128(b_addr + kk * 32), 1);
        wgmma::commit();
        clock.mark(kWgmmaMmaIssue);
#pragma unroll
        for (int j = 0; j < 128; ++j) wgmma::fence_operand(acc[j]);
        wgmma::wait<1>();
        clock.mark(kWgmmaMmaWait);
        if (kt > 0) wgmma::mbarrier_arrive(empty0 + ((s - 1) % kStages) * 8);
      }
      wgmma::wait<0>();
#pragma unroll
      for (int j = 0; j < 128; ++j) wgmma::fence_operand(acc[j]);
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

    // Accumulators → bf16 (silu(gate)·up with SiLU), a 64-column quarter of the warp's 16 rows at
    // a time through its staging, then 16-byte row chunks out. Gate+up's columns past `half` (a
    // partial last tile) hold what the gate box read past the gate rows: never stored. A warp
    // whose rows all lie past the tile's has nothing to store.
    if (16 * warp < t.rows) {
      const int col0_bytes = n_tile * tile_cols * 2, out_bytes = out_cols * 2;
#pragma unroll
      for (int q = 0; q < tile_cols / kQuarterCols; ++q) {
#pragma unroll
        for (int j = 0; j < kQuarterCols / 8; ++j) {
          const int a = 4 * (kQuarterCols / 8 * q + j);  // accumulators of columns 64q + 8j + c0, + 1
          __nv_bfloat162 v0, v1;                           // rows lane / 4 and lane / 4 + 8 of the warp's
          if constexpr (kSilu) {
            const int u = a + 4 * (kBN / 16);  // the up columns' accumulators
            v0 = __floats2bfloat162_rn(silu_fast(acc[a]) * acc[u], silu_fast(acc[a + 1]) * acc[u + 1]);
            v1 = __floats2bfloat162_rn(silu_fast(acc[a + 2]) * acc[u + 2], silu_fast(acc[a + 3]) * acc[u + 3]);
          } else {
            v0 = __floats2bfloat162_rn(acc[a], acc[a + 1]);
            v1 = __floats2bfloat162_rn(acc[a + 2], acc[a + 3]);
          }
          *reinterpret_cast<__nv_bfloat162*>(&quarter[(lane >> 2) * kQuarterPitch + (8 * j + c0) * 2]) = v0;
          *reinterpret_cast<__nv_bfloat162*>(&quarter[((lane >> 2) + 8) * kQuarterPitch + (8 * j + c0) * 2]) = v1;
        }
        __syncwarp();
        // 16 rows × 8 chunks of 16 bytes, 4 a lane
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int chunk = lane + 32 * c, row = chunk >> 3;
          const int col_bytes = col0_bytes + q * kQuarterCols * 2 + (chunk & 7) * 16;
          if (16 * warp + row < t.rows && col_bytes < out_bytes)
            *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.out) +
                                      static_cast<size_t>(t.row0 + 16 * warp + row) * out_bytes + col_bytes) =
                *reinterpret_cast<const uint4*>(&quarter[row * kQuarterPitch + (chunk & 7) * 16]);
        }
        __syncwarp();  // read before the next quarter (or tile) overwrites it
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

template <bool kSilu, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
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
  moe_wgmma_kernel<kSilu, kTmaRows><<<blocks, kThreads, kSmemBytes, stream>>>(p, n_tiles, walk_len, map, rows);
  CUDA_CHECK_LAST();
}

void raise_smem_limits() {
  for (const auto kernel : {moe_wgmma_kernel<true, false>, moe_wgmma_kernel<false, false>,
                            moe_wgmma_kernel<true, true>, moe_wgmma_kernel<false, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
}

#endif  // MOEBATCH_WGMMA

}  // namespace

void moe_wgmma_prepare() {
#if MOEBATCH_WGMMA
  raise_smem_limits();
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
  if (p.silu_gate_up)
    p.tma_rows ? launch<true, true>(p, stream) : launch<true, false>(p, stream);
  else
    p.tma_rows ? launch<false, true>(p, stream) : launch<false, false>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_wgmma: this build has no sm_90a code (see moe_wgmma_available)");
#endif
}

}  // namespace moebatch::kernels
