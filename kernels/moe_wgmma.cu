// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). One block computes a 128-row × 256-column
// tile of one expert's output: two warpgroups, each a 64-row slab, share the 256 weight rows.
// k moves through a ring of 4 slots of 64-wide slices laid out with the 128-byte swizzle wgmma
// reads (kernels/wgmma.cuh). The weight tile comes by TMA (one thread, two 128-row boxes), the A
// rows by every thread's cp.async (or, with MoeWgmmaParams::tma_rows, as one TMA box), each
// slot's arrival and release tracked by mbarriers, so the two warpgroups never meet at a block
// barrier inside the loop; a slice's MMAs overlap the next slice's, and slices are fetched
// (slots - 1) ahead. The epilogue stages the tile in shared memory so that every row leaves in
// 16-byte stores. With sorted_ids the A rows come straight from the tokens' rows (the gather of
// the gate+up stage, fused). An expert's last tile of ≤ 64 rows multiplies on one warpgroup
// (about a tenth of the tiles at 8192 tokens of the 30B shape: gate+up −3%, down −2.5% in the
// engine, bench/RESULTS.md 2026-12-06).
//
// Measured and set aside (bench/RESULTS.md, 2026-12-04 and 12-05): a 9-slot ring of 32-wide
// slices, TMA prefetch of weight slices into L2, two persistent forms (a block per SM walking the
// tiles, the ring running on into the next tile: commits ff0a0d5 and c3d1050), and 128-column
// tiles with two blocks per SM so that one block's edges run under the other's k loop (commit
// 5e4031c) — each slower.
//
// Built for sm_90a only (MOEBATCH_WGMMA, set by kernels/CMakeLists.txt); without it the entry
// points exist and moe_wgmma_available says false.
#include "kernels/moe_wgmma.cuh"

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

#if MOEBATCH_WGMMA

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile since the last moe_wgmma_take_phase_clocks (diagnostic builds
// only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

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
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  // Thread 0 brings the weight tile by TMA: two boxes of 128 rows (the gate and the up rows with
  // SiLU).
  const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;
  const int expert_row0 = t.expert * p.n;  // the expert's first row in the weight map
  const int box_row[2] = {expert_row0 + (kSilu ? n_tile * (kBN / 2) : n_tile * kBN),
                          expert_row0 + (kSilu ? half + n_tile * (kBN / 2) : n_tile * kBN + kBN / 2)};

  // Pacing (as kernels/moe_wgmma_fp8.cu): full[s] completes when every thread's cp.async into
  // slot s has landed and the TMA bytes have come (TMA rows: thread 0's arrival and the bytes);
  // empty[s] when both warpgroups' MMAs on slot s are done. No block-wide barrier in the loop:
  // each warpgroup waits only for its data and for the slot it refills.
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kThreads + 1, kThreads);

  const int kt_count = (p.k + kBK - 1) / kBK;
  // A slice's weight boxes (and its rows with kTmaRows): thread 0's TMA, counted in full[slot]
  auto load_weights = [&](int kt) {
    if (threadIdx.x != 0) return;
    const int slot = kt % kStages;
    const uint32_t bar = full0 + slot * 8, b_tile = smem_addr + slot * kStageBytes + kATile;
    wgmma::mbarrier_arrive_expect_tx(bar, kTmaRows ? kATile + kBTile : kBTile);
    if constexpr (kTmaRows) wgmma::tma_load_2d(smem_addr + slot * kStageBytes, &rows_map, kt * kBK, t.row0, bar);
    wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, box_row[0], bar);
    wgmma::tma_load_2d(b_tile + kBTile / 2, &weight_map, kt * kBK, box_row[1], bar);
  };
  // The weight slices need only the expert: the first ones are on their way before the rows'
  // ids are looked up (a dependent global load of its own).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < kt_count) load_weights(s);
  clock.mark(kWgmmaTile);

  // Each thread copies 16-byte chunk `chunk` of A's tile rows row_in_pass + kRowsPerPass·i;
  // a_src[i] is the row of `in` that A row i holds, -1 for zeros (past the segment, padding
  // pairs). Rows a weight box reads past the expert's own (a partial last tile) only feed
  // output columns that are never stored.
  int a_src[kPasses];
  if constexpr (!kTmaRows) {
    // every id is loaded before the first row_of_pair store, which the compiler must otherwise
    // assume may alias sorted_ids and wait for each load in turn
    int id[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = row_in_pass + kRowsPerPass * i;
      id[i] = p.sorted_ids && r < t.rows ? p.sorted_ids[t.row0 + r] : -1;
    }
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
  clock.mark(kWgmmaLookup);
  // A slice's rows: every thread's cp.async, one arrival each on full[slot] when they land
  auto load_rows = [&](int kt) {
    if constexpr (!kTmaRows) {
      const int slot = kt % kStages, col = kt * kBK + chunk * 8;
      uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const bool ok = col < p.k && a_src[i] >= 0;
        const bf16* src = ok ? p.in + static_cast<size_t>(a_src[i]) * p.k + col : p.in;
        cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * i, chunk), src, ok ? 16 : 0);
      }
      wgmma::cp_async_mbarrier_arrive(full0 + slot * 8);
    }
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
  // kMma false: a warpgroup whose 64-row slab lies wholly past the tile's rows (an expert's last
  // tile of ≤ 64 rows) keeps its part of the pacing — its threads' row copies, its arrivals on
  // the empty barriers — but issues no MMAs, leaving the SM's tensor cores to the other
  // warpgroup: such a tile's k loop takes about half as long. The two loops are separate
  // instantiations so that neither holds a branch around its MMAs (ptxas would serialize them).
  auto k_loop = [&]<bool kMma>() {
    for (int kt = 0; kt < kt_count; ++kt) {
      const int slot = kt % kStages;
      if constexpr (kMma) {
        wgmma::mbarrier_wait(full0 + slot * 8, (kt / kStages) & 1);
        clock.mark(kWgmmaFullWait);
        // A's copies were made by the generic proxy; the tensor cores read through the async one
        if constexpr (!kTmaRows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const uint32_t a_addr = smem_addr + slot * kStageBytes + wg * (kATile / 2);
        const uint32_t b_addr = smem_addr + slot * kStageBytes + kATile;
#pragma unroll
        for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wgmma::mma_m64n256k16(acc, wgmma::smem_desc_sw128(a_addr + kk * 32), wgmma::smem_desc_sw128(b_addr + kk * 32),
                                1);
        wgmma::commit();
        clock.mark(kWgmmaMmaIssue);
#pragma unroll
        for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
        wgmma::wait<1>();
        clock.mark(kWgmmaMmaWait);
      }
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
  };
  if (wg * (kBM / 2) >= t.rows)  // the same for the whole warpgroup
    k_loop.template operator()<false>();
  else
    k_loop.template operator()<true>();
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
  __syncthreads();  // every warpgroup is done with the stages (all copies landed): they hold the output tile now
  clock.mark(kWgmmaDrain);

  // Accumulators → bf16 tile in shared memory (layout: kernels/wgmma.cuh), then 16-byte rows out.
  bf16* out_tile = reinterpret_cast<bf16*>(smem);
  const int lane = threadIdx.x & 31;
  const int r = wg * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c = 2 * (lane & 3);
  if constexpr (kSilu) {
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      const float* g = &acc[4 * j];
      const float* u = &acc[4 * (j + kBN / 16)];
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[r * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(silu_fast(g[0]) * u[0], silu_fast(g[1]) * u[1]);
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[(r + 8) * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(silu_fast(g[2]) * u[2], silu_fast(g[3]) * u[3]);
    }
  } else {
    stage_bf16_slab(acc, out_tile, kOutPitch, r, c);
  }
  __syncthreads();
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? half : p.n;
  store_tile<kBM, kThreads>(reinterpret_cast<const uint8_t*>(out_tile), kOutPitch * 2, reinterpret_cast<uint8_t*>(p.out),
                            static_cast<size_t>(out_cols) * 2, t.row0, t.rows, n_tile * tile_cols * 2, tile_cols * 2,
                            out_cols * 2, threadIdx.x);
  clock.mark(kWgmmaEpilogue);
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_phase_totals);
#endif
}

template <bool kSilu, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t blocks = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(blocks < (int64_t{1} << 31), "moe_wgmma: too many tiles");
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma: too many weight rows");
  const CUtensorMap map =
      tensor_map_2d(p.weight, TmaElement::Bf16, static_cast<int64_t>(p.num_experts) * p.n, p.k, kBN / 2);
  // without TMA rows the kernel never reads its rows map: the weights' stands in
  const CUtensorMap rows = kTmaRows ? tensor_map_2d(p.in, TmaElement::Bf16, p.rows_cap, p.k, kBM) : map;
  moe_wgmma_kernel<kSilu, kTmaRows><<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(p, n_tiles, map,
                                                                                                      rows);
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
