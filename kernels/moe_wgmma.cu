// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). One block computes a 128-row × 256-column
// tile of one expert's output: two warpgroups, each a 64-row slab, share the 256 weight rows.
// k moves through a ring of 4 slots of 64-wide slices laid out with the 128-byte swizzle wgmma
// reads (kernels/wgmma.cuh). The weight tile comes by TMA (one thread, two 128-row boxes), the A
// rows by every thread's cp.async (or, with MoeWgmmaParams::tma_rows, as one TMA box), each
// slot's arrival and release tracked by mbarriers, so the two warpgroups never meet at a block
// barrier inside the loop; a slice's MMAs overlap the next slice's, and slices are fetched
// (slots - 1) ahead. The epilogue stages the tile in shared memory so that every row leaves in
// 16-byte stores. With sorted_ids the A rows come straight from the tokens' rows (the gather of
// the gate+up stage, fused).
//
// Measured and set aside (bench/RESULTS.md, 2026-12-04): a 9-slot ring of 32-wide slices, TMA
// prefetch of weight slices into L2, and a persistent form (a block per SM walking the tiles,
// the ring running on into the next tile: commit ff0a0d5) — each slower.
//
// Built for sm_90a only (MOEBATCH_WGMMA, set by kernels/CMakeLists.txt); without it the entry
// points exist and moe_wgmma_available says false.
#include "kernels/moe_wgmma.cuh"

#include <algorithm>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_tiles.cuh"
#include "kernels/phase_clock.cuh"
#include "kernels/tensor_map.cuh"
#if MOEBATCH_WGMMA
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

constexpr int kBM = 128;  // rows per block: one 64-row slab per warpgroup
constexpr int kBN = 256;  // weight rows per block (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kThreads = 256;

// The k ring: 64-wide slices (one 128-byte swizzled row per tile row) in 4 slots — one computing,
// one whose MMAs are retiring, the rest landing.
constexpr int kBK = 64, kStages = 4;
constexpr int kRowBytes = kBK * 2;
constexpr int kChunks = kRowBytes / 16;            // 16-byte chunks per tile row
constexpr int kRowsPerPass = kThreads / kChunks;   // A rows one cp.async per thread covers
constexpr int kPasses = kBM / kRowsPerPass;
constexpr int kATile = kBM * kRowBytes;            // bytes; multiples of 1024 keep every tile aligned
constexpr int kBTile = kBN * kRowBytes;
constexpr int kStageBytes = kATile + kBTile;       // 48 KB
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + slack to align the base to 1024
constexpr int kOutPitch = kBN + 8;                 // epilogue staging row (elements): 16 bytes of padding
static_assert(kBM * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the stages");
static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "tiles stay aligned to the swizzle atoms");
static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
// The persistent form: 128 output columns staged at a time in one slot, and the experts' offsets
// (at most kPersistentMaxExperts + 1) after the ring.
constexpr int kStageCols = 128;
constexpr int kStagePitch = kStageCols + 8;  // staging row (elements): 16 bytes of padding
static_assert(kBM * kStagePitch * 2 <= kStageBytes, "a staged pass fits one slot");
constexpr int kPersistentMaxExperts = 1024;
constexpr int kPersistentSmemMax = kSmemBytes + (kPersistentMaxExperts + 1) * 4;
static_assert(kPersistentSmemMax <= 227 * 1024, "one block's shared memory");

#if MOEBATCH_WGMMA

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile since the last moe_wgmma_take_phase_clocks (diagnostic builds
// only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

// Pieces both kernels below share, per thread (chunk, row_in_pass: this thread's 16-byte chunk of
// A's rows row_in_pass + kRowsPerPass·i).

// The gathered rows' pair ids of tile t (-1 where none). Loaded before any row_of_pair store,
// which the compiler must otherwise assume may alias sorted_ids and wait for each load in turn.
__device__ __forceinline__ void load_pair_ids(const MoeWgmmaParams& p, const MoeTile& t, int row_in_pass,
                                              int (&id)[kPasses]) {
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = row_in_pass + kRowsPerPass * i;
    id[i] = p.sorted_ids && r < t.rows ? p.sorted_ids[t.row0 + r] : -1;
  }
}

// a_src[i]: the row of `in` that A row row_in_pass + kRowsPerPass·i holds, -1 for zeros (past
// the segment, padding pairs); with a gather, row_of_pair written once (column tile 0, chunk 0).
__device__ __forceinline__ void rows_of_ids(const MoeWgmmaParams& p, const MoeTile& t, int n_tile, int chunk,
                                            int row_in_pass, const int (&id)[kPasses], int (&a_src)[kPasses]) {
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = row_in_pass + kRowsPerPass * i, row = t.row0 + r;
    a_src[i] = r < t.rows ? row : -1;
    if (p.sorted_ids && r < t.rows) {
      const bool real = id[i] >= 0 && id[i] < p.num_pairs;
      a_src[i] = real ? id[i] / p.in_row_div : -1;
      if (real && p.row_of_pair && n_tile == 0 && chunk == 0) p.row_of_pair[id[i]] = row;
    }
  }
}

// The first weight rows of a tile's two 128-row boxes (the gate and the up rows with SiLU).
template <bool kSilu>
__device__ __forceinline__ void weight_boxes(const MoeWgmmaParams& p, int expert, int n_tile, int (&box_row)[2]) {
  const int expert_row0 = expert * p.n;
  box_row[0] = expert_row0 + (kSilu ? n_tile * (kBN / 2) : n_tile * kBN);
  box_row[1] = expert_row0 + (kSilu ? p.n / 2 + n_tile * (kBN / 2) : n_tile * kBN + kBN / 2);
}

// Thread 0: k slice kt's weight boxes (and with kTmaRows its 128 rows from row0) into the slot at
// a_tile (A) / a_tile + kATile (B), announced on the slot's full barrier `bar`.
template <bool kTmaRows>
__device__ __forceinline__ void load_weight_slice(const CUtensorMap* weight_map, const CUtensorMap* rows_map,
                                                  uint32_t a_tile, uint32_t bar, int kt, int row0,
                                                  const int (&box_row)[2]) {
  const uint32_t b_tile = a_tile + kATile;
  wgmma::mbarrier_arrive_expect_tx(bar, kTmaRows ? kATile + kBTile : kBTile);
  if constexpr (kTmaRows) wgmma::tma_load_2d(a_tile, rows_map, kt * kBK, row0, bar);
  wgmma::tma_load_2d(b_tile, weight_map, kt * kBK, box_row[0], bar);
  wgmma::tma_load_2d(b_tile + kBTile / 2, weight_map, kt * kBK, box_row[1], bar);
}

// Every thread: its chunks of k slice kt's A rows by cp.async into the slot at a_tile, then one
// arrival on `bar` when they land.
__device__ __forceinline__ void load_row_slice(const MoeWgmmaParams& p, uint8_t* a_tile, uint32_t bar, int kt,
                                               int chunk, int row_in_pass, const int (&a_src)[kPasses]) {
  const int col = kt * kBK + chunk * 8;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const bool ok = col < p.k && a_src[i] >= 0;
    const bf16* src = ok ? p.in + static_cast<size_t>(a_src[i]) * p.k + col : p.in;
    cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * i, chunk), src, ok ? 16 : 0);
  }
  wgmma::cp_async_mbarrier_arrive(bar);
}

// One k slice's MMAs into this warpgroup's accumulators, committed as one group.
__device__ __forceinline__ void mma_slice(float (&acc)[128], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    wgmma::mma_m64n256k16(acc, wgmma::smem_desc_sw128(a_addr + kk * 32), wgmma::smem_desc_sw128(b_addr + kk * 32), 1);
  wgmma::commit();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
}

// Accumulator columns [8·kJ0, 8·(kJ0 + kJn)) (with SiLU: silu(gate)·up of gate columns there,
// up kBN / 2 further) as bf16 into a shared tile of `pitch` elements, at columns from 0; this
// thread's rows r and r + 8, columns 8j + c and + 1 (layout: kernels/wgmma.cuh).
template <bool kSilu, int kJ0, int kJn>
__device__ __forceinline__ void stage_columns(const float (&acc)[128], bf16* tile, int pitch, int r, int c) {
#pragma unroll
  for (int j = 0; j < kJn; ++j) {
    const float* v = &acc[4 * (kJ0 + j)];
    __nv_bfloat162 lo, hi;
    if constexpr (kSilu) {
      const float* u = &acc[4 * (kJ0 + j + kBN / 16)];
      lo = __floats2bfloat162_rn(silu_fast(v[0]) * u[0], silu_fast(v[1]) * u[1]);
      hi = __floats2bfloat162_rn(silu_fast(v[2]) * u[2], silu_fast(v[3]) * u[3]);
    } else {
      lo = __floats2bfloat162_rn(v[0], v[1]);
      hi = __floats2bfloat162_rn(v[2], v[3]);
    }
    *reinterpret_cast<__nv_bfloat162*>(&tile[r * pitch + 8 * j + c]) = lo;
    *reinterpret_cast<__nv_bfloat162*>(&tile[(r + 8) * pitch + 8 * j + c]) = hi;
  }
}

// kTmaRows (MoeWgmmaParams::tma_rows): A's 128 rows come as one TMA box like the weights, rows
// past the tile's own (the next expert's, or zeros past rows_cap) only feeding output rows that
// are never stored; no thread copies anything.
template <bool kSilu, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles, const __grid_constant__ CUtensorMap weight_map,
                     const __grid_constant__ CUtensorMap rows_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  const int m = static_cast<int>(blockIdx.x / n_tiles), n_tile = static_cast<int>(blockIdx.x % n_tiles);
  MoeTile t;
  if (!block_moe_tile<kBM>(p.expert_offsets, p.num_experts, m, t)) return;

  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // warpgroup: rows [64·wg, 64·wg + 64) of the tile
  const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;
  int box_row[2];
  weight_boxes<kSilu>(p, t.expert, n_tile, box_row);

  // Pacing (as kernels/moe_wgmma_fp8.cu): full[s] completes when every thread's cp.async into
  // slot s has landed and the TMA bytes have come (TMA rows: thread 0's arrival and the bytes);
  // empty[s] when both warpgroups' MMAs on slot s are done. No block-wide barrier in the loop:
  // each warpgroup waits only for its data and for the slot it refills.
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kThreads + 1, kThreads);

  const int kt_count = (p.k + kBK - 1) / kBK;
  const auto load_weights = [&](int kt) {
    const int slot = kt % kStages;
    if (threadIdx.x == 0)
      load_weight_slice<kTmaRows>(&weight_map, &rows_map, smem_addr + slot * kStageBytes, full0 + slot * 8, kt,
                                  t.row0, box_row);
  };
  // The weight slices need only the expert: the first ones are on their way before the rows'
  // ids are looked up (a dependent global load of its own).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < kt_count) load_weights(s);
  int a_src[kPasses];
  if constexpr (!kTmaRows) {
    int id[kPasses];
    load_pair_ids(p, t, row_in_pass, id);
    rows_of_ids(p, t, n_tile, chunk, row_in_pass, id, a_src);
  }
  clock.mark(kWgmmaLookup);
  const auto load_rows = [&](int kt) {
    const int slot = kt % kStages;
    if constexpr (!kTmaRows)
      load_row_slice(p, smem + slot * kStageBytes, full0 + slot * 8, kt, chunk, row_in_pass, a_src);
  };

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;

  // Slices kStages - 1 ahead. Iteration kt issues slice kt's MMAs, waits for slice kt - 1's
  // (wait<1>: kt's may still run), releases that slot, then refills it with slice
  // kt + kStages - 1.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < kt_count) load_rows(s);
  clock.mark(kWgmmaFill);
  for (int kt = 0; kt < kt_count; ++kt) {
    const int slot = kt % kStages;
    wgmma::mbarrier_wait(full0 + slot * 8, (kt / kStages) & 1);
    clock.mark(kWgmmaFullWait);
    // A's copies were made by the generic proxy; the tensor cores read through the async one
    if constexpr (!kTmaRows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    mma_slice(acc, smem_addr + slot * kStageBytes + wg * (kATile / 2), smem_addr + slot * kStageBytes + kATile);
    clock.mark(kWgmmaMmaIssue);
    wgmma::wait<1>();
    clock.mark(kWgmmaMmaWait);
    if (kt > 0) wgmma::mbarrier_arrive(empty0 + ((kt - 1) % kStages) * 8);
    const int next = kt + kStages - 1;
    if (next < kt_count) {
      if (next >= kStages) wgmma::mbarrier_wait(empty0 + (next % kStages) * 8, (next / kStages - 1) & 1);
      clock.mark(kWgmmaEmptyWait);
      load_weights(next);
      load_rows(next);
      clock.mark(kWgmmaRefill);
    }
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
  __syncthreads();  // every warpgroup is done with the stages (all copies landed): they hold the output tile now
  clock.mark(kWgmmaDrain);

  // Accumulators → bf16 tile in shared memory, then 16-byte rows out.
  bf16* out_tile = reinterpret_cast<bf16*>(smem);
  const int lane = threadIdx.x & 31;
  const int r = wg * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c = 2 * (lane & 3);
  stage_columns<kSilu, 0, kSilu ? kBN / 16 : kBN / 8>(acc, out_tile, kOutPitch, r, c);
  __syncthreads();
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? p.n / 2 : p.n;
  store_tile<kBM, kThreads>(reinterpret_cast<const uint8_t*>(out_tile), kOutPitch * 2, reinterpret_cast<uint8_t*>(p.out),
                            static_cast<size_t>(out_cols) * 2, t.row0, t.rows, n_tile * tile_cols * 2, tile_cols * 2,
                            out_cols * 2);
  clock.mark(kWgmmaEpilogue);
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_phase_totals);
#endif
}

// The persistent form (MoeWgmmaParams::tile_counter): a block per SM takes tiles (row tile
// index / n_tiles, column tile index % n_tiles) from the counter, two ahead, and its k ring runs
// on from one tile into the next: the next tile's first slices land during this tile's last
// MMAs and its epilogue. The experts' offsets are copied to shared memory once, so finding the
// next tile (at this tile's first slice) loads nothing but its rows' pair ids, which are used one
// slice later. The epilogue stages 128 columns at a time in the slot of the tile's last slice
// (the one slot no load targets then) and writes each row with a bulk copy that runs on while
// the next tile's MMAs start; the slot is released only once the copies have read it.
template <bool kSilu, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_persistent_kernel(MoeWgmmaParams p, int n_tiles, int tiles, const __grid_constant__ CUtensorMap weight_map,
                                const __grid_constant__ CUtensorMap rows_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // warpgroup: rows [64·wg, 64·wg + 64) of the tile
  const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;
  int32_t* offsets = reinterpret_cast<int32_t*>(smem + kStages * kStageBytes);  // [num_experts + 1]
  for (int i = threadIdx.x; i <= p.num_experts; i += kThreads) offsets[i] = p.expert_offsets[i];
  // Tile j's index is sched[j % 3]: thread 0 takes tile j + 2's at tile j's first slice, into the
  // entry every thread last read before tile j − 1's drain barrier.
  __shared__ int sched[3];
  if (threadIdx.x == 0) {
    sched[0] = atomicAdd(&p.tile_counter[0], 1);
    sched[1] = atomicAdd(&p.tile_counter[0], 1);
  }
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kThreads + 1, kThreads);  // + block barrier

  struct Tile {
    MoeTile t;
    int n_tile;
    int box_row[2];
    int a_src[kPasses];
  };
  const auto find = [&](int index, Tile& x) {
    if (index >= tiles || !find_moe_tile<kBM>(offsets, p.num_experts, index / n_tiles, x.t)) return false;
    x.n_tile = index % n_tiles;
    weight_boxes<kSilu>(p, x.t.expert, x.n_tile, x.box_row);
    return true;
  };
  const auto load_slice = [&](const Tile& x, int kt, int slot) {
    const uint32_t bar = full0 + slot * 8;
    if (threadIdx.x == 0)
      load_weight_slice<kTmaRows>(&weight_map, &rows_map, smem_addr + slot * kStageBytes, bar, kt, x.t.row0, x.box_row);
    if constexpr (!kTmaRows) load_row_slice(p, smem + slot * kStageBytes, bar, kt, chunk, row_in_pass, x.a_src);
  };

  Tile cur, nxt;
  int id[kPasses];
  if (find(sched[0], cur)) {
    if constexpr (!kTmaRows) {
      load_pair_ids(p, cur.t, row_in_pass, id);
      rows_of_ids(p, cur.t, cur.n_tile, chunk, row_in_pass, id, cur.a_src);
    }
    // Slices are numbered g = 0, 1, ... across the block's tiles (tile j's k slice kt is
    // g = j · kt_count + kt) and go to slot g % kStages, `ahead` of the one multiplied — at most
    // a whole tile ahead, so a load is for the current tile or the next. The next tile's rows
    // are settled at slice `settle`, before its first load.
    const int kt_count = (p.k + kBK - 1) / kBK;
    const int ahead = min(kStages - 1, kt_count), settle = min(1, kt_count - ahead);
    for (int g = 0; g < ahead; ++g) load_slice(cur, g, g);
    clock.mark(kWgmmaFill);

    const int lane = threadIdx.x & 31;
    const int r = wg * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c = 2 * (lane & 3);
    const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
    float acc[128];
    int g = 0, tiles_done = 0;
    bool storing = false;  // this thread's row copies of the last epilogue may still read their slot
    for (int j = 0;; ++j) {
      bool have_next = false;
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      const int g0 = g;  // this tile's first slice
      for (int kt = 0; kt < kt_count; ++kt, ++g) {
        const int slot = g % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (g / kStages) & 1);
        clock.mark(kWgmmaFullWait);
        if constexpr (!kTmaRows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        mma_slice(acc, smem_addr + slot * kStageBytes + wg * (kATile / 2), smem_addr + slot * kStageBytes + kATile);
        clock.mark(kWgmmaMmaIssue);
        if (kt == 0) {  // the next tile, while the tensor cores run this slice
          const int index = sched[(j + 1) % 3];
          if (threadIdx.x == 0) sched[(j + 2) % 3] = atomicAdd(&p.tile_counter[0], 1);
          have_next = find(index, nxt);
          if (!kTmaRows && have_next) load_pair_ids(p, nxt.t, row_in_pass, id);
        }
        if (!kTmaRows && have_next && kt == settle)
          rows_of_ids(p, nxt.t, nxt.n_tile, chunk, row_in_pass, id, nxt.a_src);
        clock.mark(kWgmmaLookup);
        wgmma::wait<1>();
        clock.mark(kWgmmaMmaWait);
        if (g > 0) {  // slice g − 1 is done with (a previous tile's last: also its rows copied out)
          if (kt == 0 && storing) wgmma::bulk_wait_read<0>();
          wgmma::mbarrier_arrive(empty0 + ((g - 1) % kStages) * 8);
        }
        const int next = g + ahead, next_kt = next - g0;
        if (next_kt < kt_count || have_next) {
          if (next >= kStages) wgmma::mbarrier_wait(empty0 + (next % kStages) * 8, (next / kStages - 1) & 1);
          clock.mark(kWgmmaEmptyWait);
          if (next_kt < kt_count)
            load_slice(cur, next_kt, next % kStages);
          else
            load_slice(nxt, next_kt - kt_count, next % kStages);
          clock.mark(kWgmmaRefill);
        }
      }
      wgmma::wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
      __syncthreads();  // both warpgroups are done with the last slice's slot: it stages the output now
      clock.mark(kWgmmaDrain);

      // 128 columns at a time into the slot of slice g − 1, each row out by one bulk copy
      bf16* staged = reinterpret_cast<bf16*>(smem + ((g - 1) % kStages) * kStageBytes);
      const uint32_t staged_addr = smem_addr + ((g - 1) % kStages) * kStageBytes;
      storing = threadIdx.x < cur.t.rows;
#pragma unroll
      for (int pass = 0; pass < (kSilu ? 1 : 2); ++pass) {
        if (pass > 0) {  // the first pass's rows read before they are overwritten
          if (storing) wgmma::bulk_wait_read<0>();
          __syncthreads();
        }
        if (pass == 0)
          stage_columns<kSilu, 0, kStageCols / 8>(acc, staged, kStagePitch, r, c);
        else
          stage_columns<kSilu, kStageCols / 8, kStageCols / 8>(acc, staged, kStagePitch, r, c);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the bulk copies' reads
        __syncthreads();
        const int col0 = cur.n_tile * tile_cols + pass * kStageCols;
        if (storing && col0 < out_cols) {
          bf16* dst = p.out + static_cast<size_t>(cur.t.row0 + threadIdx.x) * out_cols + col0;
          wgmma::bulk_copy_s2g(dst, staged_addr + threadIdx.x * kStagePitch * 2, min(kStageCols, out_cols - col0) * 2);
          wgmma::bulk_commit();
        }
      }
      clock.mark(kWgmmaEpilogue);
      ++tiles_done;
      if (!have_next) break;
      cur = nxt;
    }
    if (storing) wgmma::bulk_wait<0>();  // the last rows written before the block ends
#if MOEBATCH_PHASE_CLOCKS
    clock.flush(g_phase_totals, tiles_done);
#else
    (void)tiles_done;
#endif
  }
  // The last block out leaves the counter at zero for the next launch.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&p.tile_counter[1], 1) == static_cast<int>(gridDim.x) - 1) {
      p.tile_counter[0] = 0;
      p.tile_counter[1] = 0;
      __threadfence();
    }
  }
}

// Launch geometry and tensor maps of either form.
template <bool kSilu, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t tiles = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(tiles < (int64_t{1} << 31), "moe_wgmma: too many tiles");
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma: too many weight rows");
  const CUtensorMap map =
      tensor_map_2d(p.weight, TmaElement::Bf16, static_cast<int64_t>(p.num_experts) * p.n, p.k, kBN / 2);
  // without TMA rows the kernel never reads its rows map: the weights' stands in
  const CUtensorMap rows = kTmaRows ? tensor_map_2d(p.in, TmaElement::Bf16, p.rows_cap, p.k, kBM) : map;
  if (p.tile_counter == nullptr) {
    moe_wgmma_kernel<kSilu, kTmaRows><<<static_cast<unsigned>(tiles), kThreads, kSmemBytes, stream>>>(p, n_tiles, map,
                                                                                                     rows);
  } else {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, sms));
    const size_t smem = kSmemBytes + (p.num_experts + 1) * sizeof(int32_t);
    moe_wgmma_persistent_kernel<kSilu, kTmaRows><<<blocks, kThreads, smem, stream>>>(p, n_tiles, static_cast<int>(tiles),
                                                                                      map, rows);
  }
  CUDA_CHECK_LAST();
}

void raise_smem_limits() {
  for (const auto kernel : {moe_wgmma_kernel<true, false>, moe_wgmma_kernel<false, false>,
                            moe_wgmma_kernel<true, true>, moe_wgmma_kernel<false, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  for (const auto kernel : {moe_wgmma_persistent_kernel<true, false>, moe_wgmma_persistent_kernel<false, false>,
                            moe_wgmma_persistent_kernel<true, true>, moe_wgmma_persistent_kernel<false, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPersistentSmemMax));
}

#endif  // MOEBATCH_WGMMA

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

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
  MB_CHECK(!p.tile_counter || p.num_experts <= kPersistentMaxExperts, "moe_wgmma: the persistent form takes up to " +
                                                                          std::to_string(kPersistentMaxExperts) +
                                                                          " experts");
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
