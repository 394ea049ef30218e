// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). A tile is 128 rows × 256 columns of one
// expert's output: two warpgroups, each a 64-row slab, share the 256 weight rows. The kernel is
// persistent: one block per SM walks tiles blockIdx.x, + gridDim.x, ... and k moves through one
// ring of 4 slots of 64-wide slices (128-byte rows in the swizzle wgmma reads, kernels/wgmma.cuh)
// that runs on across tiles: the next tile's first slices land during this tile's last MMAs and
// its epilogue, and its rows are looked up while this tile's first slice is multiplied. The
// weight tile comes by TMA (one thread, two 128-row boxes), the A rows by every thread's
// cp.async (or, with MoeWgmmaParams::tma_rows, as one TMA box), each slot's arrival and release
// tracked by mbarriers, so the two warpgroups never meet at a block barrier inside the loop; a
// slice's MMAs overlap the next slice's. The epilogue stages the tile, 128 columns at a time, in
// the slot the tile's last slice used (the one slot no load targets then), so that every row
// leaves in 16-byte stores. With sorted_ids the A rows come straight from the tokens' rows (the
// gather of the gate+up stage, fused).
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

constexpr int kBM = 128;      // rows per tile: one 64-row slab per warpgroup
constexpr int kBN = 256;      // weight rows per tile (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kThreads = 256;
// The k ring: 64-wide slices (one 128-byte swizzled row per tile row) in 4 slots — one computing,
// one whose MMAs are retiring, the rest landing. A 9-slot ring of 32-wide slices measured slower
// (bench/RESULTS.md, 2026-12-04).
constexpr int kBK = 64, kStages = 4;
constexpr int kRowBytes = kBK * 2;
constexpr int kChunks = kRowBytes / 16;            // 16-byte chunks per tile row
constexpr int kRowsPerPass = kThreads / kChunks;   // A rows one cp.async per thread covers
constexpr int kPasses = kBM / kRowsPerPass;
constexpr int kATile = kBM * kRowBytes;            // bytes; multiples of 1024 keep every tile aligned
constexpr int kBTile = kBN * kRowBytes;
constexpr int kStageBytes = kATile + kBTile;       // 48 KB
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + slack to align the base to 1024
constexpr int kStageCols = 128;                    // output columns staged at a time
constexpr int kStagePitch = kStageCols + 8;        // staging row (elements): 16 bytes of padding
static_assert(kBM * kStagePitch * 2 <= kStageBytes, "a staged pass fits one slot");
static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "tiles stay aligned to the swizzle atoms");
static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");

#if MOEBATCH_WGMMA

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile since the last moe_wgmma_take_phase_clocks (diagnostic builds
// only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

// One tile of a block's walk, as each thread needs it: the rows, the weight boxes, and the rows
// of `in` that this thread's A chunks copy.
struct WgmmaTile {
  MoeTile t;
  int n_tile;
  int box_row[2];       // first weight rows of the two 128-row boxes (gate and up rows with SiLU)
  int a_src[kPasses];   // row of `in` for A rows row_in_pass + kRowsPerPass·i; -1: zeros
};

// Tile `index` of the launch (row tile index / n_tiles, column tile index % n_tiles) for every
// thread; false past the last row tile (and for every later index). Each warp searches the
// offsets itself: no block barrier, so a block looks up its next tile while it multiplies.
// Every id is loaded before the first row_of_pair store, which the compiler must otherwise
// assume may alias sorted_ids and wait for each load in turn.
template <bool kSilu, bool kTmaRows>
__device__ __forceinline__ bool look_up_tile(const MoeWgmmaParams& p, int64_t index, int n_tiles, WgmmaTile& x) {
  const int m = static_cast<int>(index / n_tiles);
  x.n_tile = static_cast<int>(index % n_tiles);
  if (!find_moe_tile<kBM>(p.expert_offsets, p.num_experts, m, x.t)) return false;
  const int expert_row0 = x.t.expert * p.n, half = p.n / 2;
  x.box_row[0] = expert_row0 + (kSilu ? x.n_tile * (kBN / 2) : x.n_tile * kBN);
  x.box_row[1] = expert_row0 + (kSilu ? half + x.n_tile * (kBN / 2) : x.n_tile * kBN + kBN / 2);
  if constexpr (!kTmaRows) {
    const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;
    int id[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = row_in_pass + kRowsPerPass * i;
      id[i] = p.sorted_ids && r < x.t.rows ? p.sorted_ids[x.t.row0 + r] : -1;
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = row_in_pass + kRowsPerPass * i, row = x.t.row0 + r;
      x.a_src[i] = r < x.t.rows ? row : -1;
      if (p.sorted_ids && r < x.t.rows) {
        const bool real = id[i] >= 0 && id[i] < p.num_pairs;
        x.a_src[i] = real ? id[i] / p.in_row_div : -1;
        if (real && p.row_of_pair && x.n_tile == 0 && chunk == 0) p.row_of_pair[id[i]] = row;
      }
    }
  }
  return true;
}

// kTmaRows (MoeWgmmaParams::tma_rows): A's 128 rows come as one TMA box like the weights, rows
// past the tile's own (the next expert's, or zeros past rows_cap) only feeding output rows that
// are never stored; no thread copies anything.
template <bool kSilu, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles, int64_t tiles, const __grid_constant__ CUtensorMap weight_map,
                     const __grid_constant__ CUtensorMap rows_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  int64_t index = blockIdx.x;
  WgmmaTile cur, nxt;
  if (!look_up_tile<kSilu, kTmaRows>(p, index, n_tiles, cur)) return;

  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // warpgroup: rows [64·wg, 64·wg + 64) of the tile
  const int chunk = threadIdx.x % kChunks, row_in_pass = threadIdx.x / kChunks;

  // Pacing (as kernels/moe_wgmma_fp8.cu): full[s] completes when every thread's cp.async into
  // slot s has landed and the TMA bytes have come (TMA rows: thread 0's arrival and the bytes);
  // empty[s] when both warpgroups' MMAs on slot s are done and the staging there is read. No
  // block-wide barrier in the loop: each warpgroup waits only for its data and for the slot it
  // refills.
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kThreads + 1, kThreads);

  // Slice kt of tile x into `slot`: thread 0's TMA boxes, every thread's A chunks.
  const auto load_slice = [&](const WgmmaTile& x, int kt, int slot) {
    const uint32_t bar = full0 + slot * 8, a_tile = smem_addr + slot * kStageBytes, b_tile = a_tile + kATile;
    if (threadIdx.x == 0) {
      wgmma::mbarrier_arrive_expect_tx(bar, kTmaRows ? kATile + kBTile : kBTile);
      if constexpr (kTmaRows) wgmma::tma_load_2d(a_tile, &rows_map, kt * kBK, x.t.row0, bar);
      wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, x.box_row[0], bar);
      wgmma::tma_load_2d(b_tile + kBTile / 2, &weight_map, kt * kBK, x.box_row[1], bar);
    }
    if constexpr (!kTmaRows) {
      const int col = kt * kBK + chunk * 8;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const bool ok = col < p.k && x.a_src[i] >= 0;
        const bf16* src = ok ? p.in + static_cast<size_t>(x.a_src[i]) * p.k + col : p.in;
        cp_async16(smem + slot * kStageBytes + wgmma::sw128_offset(row_in_pass + kRowsPerPass * i, chunk), src,
                   ok ? 16 : 0);
      }
      wgmma::cp_async_mbarrier_arrive(bar);
    }
  };

  // Slices are numbered g = 0, 1, ... across the block's tiles (tile j's k slice kt is
  // g = j · kt_count + kt) and go to slot g % kStages, `ahead` of the one multiplied — at most a
  // whole tile ahead, so a load is for the current tile or the next.
  const int kt_count = (p.k + kBK - 1) / kBK;
  const int ahead = min(kStages - 1, kt_count);
  for (int g = 0; g < ahead; ++g) load_slice(cur, g, g);
  clock.mark(kWgmmaFill);

  const int lane = threadIdx.x & 31;
  const int r = wg * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c = 2 * (lane & 3);
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  float acc[128];
  int g = 0;  // the slice multiplied next
  unsigned tiles_done = 0;
  for (;;) {
    bool have_next = false;
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    const int g0 = g;  // this tile's first slice
    for (int kt = 0; kt < kt_count; ++kt, ++g) {
      const int slot = g % kStages;
      wgmma::mbarrier_wait(full0 + slot * 8, (g / kStages) & 1);
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
      if (kt == 0) {  // the next tile's rows, while the tensor cores run this slice
        have_next = index + gridDim.x < tiles && look_up_tile<kSilu, kTmaRows>(p, index + gridDim.x, n_tiles, nxt);
        clock.mark(kWgmmaLookup);
      }
#pragma unroll
      for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
      wgmma::wait<1>();
      clock.mark(kWgmmaMmaWait);
      // slice g − 1 is done with (the previous tile's last slice: also its staged output read)
      if (g > 0) wgmma::mbarrier_arrive(empty0 + ((g - 1) % kStages) * 8);
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

    // Accumulators → bf16 in shared memory (layout: kernels/wgmma.cuh), 128 columns at a time,
    // then 16-byte rows out. The slot of slice g − 1 is the one no load targets until every
    // thread has released it in the next tile's first iteration.
    bf16* staged = reinterpret_cast<bf16*>(smem + ((g - 1) % kStages) * kStageBytes);
#pragma unroll
    for (int pass = 0; pass < tile_cols / kStageCols; ++pass) {
      if (pass > 0) __syncthreads();  // the previous pass is stored
#pragma unroll
      for (int j = 0; j < kStageCols / 8; ++j) {
        const float* v = &acc[4 * (j + pass * kStageCols / 8)];
        __nv_bfloat162 lo, hi;  // rows r and r + 8, columns 8j + c, + 1
        if constexpr (kSilu) {
          const float* u = &acc[4 * (j + kBN / 16)];
          lo = __floats2bfloat162_rn(silu_fast(v[0]) * u[0], silu_fast(v[1]) * u[1]);
          hi = __floats2bfloat162_rn(silu_fast(v[2]) * u[2], silu_fast(v[3]) * u[3]);
        } else {
          lo = __floats2bfloat162_rn(v[0], v[1]);
          hi = __floats2bfloat162_rn(v[2], v[3]);
        }
        *reinterpret_cast<__nv_bfloat162*>(&staged[r * kStagePitch + 8 * j + c]) = lo;
        *reinterpret_cast<__nv_bfloat162*>(&staged[(r + 8) * kStagePitch + 8 * j + c]) = hi;
      }
      __syncthreads();
      store_tile<kBM, kThreads>(reinterpret_cast<const uint8_t*>(staged), kStagePitch * 2,
                                reinterpret_cast<uint8_t*>(p.out), static_cast<size_t>(out_cols) * 2, cur.t.row0,
                                cur.t.rows, (cur.n_tile * tile_cols + pass * kStageCols) * 2, kStageCols * 2,
                                out_cols * 2);
    }
    // the slot's next writer is TMA or cp.async (the async proxy) after this thread's release
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    clock.mark(kWgmmaEpilogue);
    ++tiles_done;
    if (!have_next) break;
    cur = nxt;
    index += gridDim.x;
  }
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_phase_totals, tiles_done);
#endif
}

template <bool kSilu, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t tiles = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(tiles < (int64_t{1} << 31), "moe_wgmma: too many tiles");
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma: too many weight rows");
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const CUtensorMap map =
      tensor_map_2d(p.weight, TmaElement::Bf16, static_cast<int64_t>(p.num_experts) * p.n, p.k, kBN / 2);
  // without TMA rows the kernel never reads its rows map: the weights' stands in
  const CUtensorMap rows = kTmaRows ? tensor_map_2d(p.in, TmaElement::Bf16, p.rows_cap, p.k, kBM) : map;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, sms));
  moe_wgmma_kernel<kSilu, kTmaRows><<<blocks, kThreads, kSmemBytes, stream>>>(p, n_tiles, tiles, map, rows);
  CUDA_CHECK_LAST();
}

void raise_smem_limits() {
  for (const auto kernel : {moe_wgmma_kernel<true, false>, moe_wgmma_kernel<false, false>,
                            moe_wgmma_kernel<true, true>, moe_wgmma_kernel<false, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
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
