// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). One block computes a 128-row × 256-column
// tile of one expert's output: two warpgroups, each a 64-row slab, share the 256 weight rows.
// k moves through a ring of slices laid out with the swizzle wgmma reads (kernels/wgmma.cuh):
// by default 4 slots of 64-wide slices (128-byte rows), or with MoeWgmmaParams::deep_ring 9 slots
// of 32-wide ones (64-byte rows: a third more bytes in flight in about the same shared memory).
// The weight tile comes by TMA (one thread, two 128-row boxes), the A rows by every thread's
// cp.async, each slot's arrival and release tracked by mbarriers, so the two warpgroups never
// meet at a block barrier inside the loop; a slice's MMAs overlap the next slice's, and slices
// are fetched (slots - 1) ahead. The epilogue stages the tile in shared memory so that every row
// leaves in 16-byte stores. With sorted_ids the A rows come straight from the tokens' rows (the
// gather of the gate+up stage, fused).
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

constexpr int kBM = 128;     // rows per block: one 64-row slab per warpgroup
constexpr int kBN = 256;     // weight rows per block (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kThreads = 256;
constexpr int kOutPitch = kBN + 8;  // epilogue staging row (elements): 16 bytes of padding

// The k pipeline: kBK-wide slices (one swizzled shared-memory row of kBK · 2 bytes per tile row)
// in kStages slots — one computing, one whose MMAs are retiring, the rest landing.
template <int kBK_, int kStages_>
struct Ring {
  static constexpr int kBK = kBK_, kStages = kStages_;
  static constexpr int kRowBytes = kBK * 2;
  static constexpr int kChunks = kRowBytes / 16;        // 16-byte chunks per tile row
  static constexpr int kRowsPerPass = kThreads / kChunks;  // A rows one cp.async per thread covers
  static constexpr int kPasses = kBM / kRowsPerPass;
  static constexpr int kATile = kBM * kRowBytes;  // bytes; multiples of 1024 keep every tile aligned
  static constexpr int kBTile = kBN * kRowBytes;
  static constexpr int kStageBytes = kATile + kBTile;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + slack to align the base to 1024
  static_assert(kBM * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the stages");
  static_assert(kATile % 1024 == 0 && kBTile % 1024 == 0, "tiles stay aligned to the swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
};
using Ring64 = Ring<64, 4>;  // 4 × 48 KB
using Ring32 = Ring<32, 9>;  // 9 × 24 KB (MoeWgmmaParams::deep_ring)

#if MOEBATCH_WGMMA

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile since the last moe_wgmma_take_phase_clocks (diagnostic builds
// only: kernels/phase_clock.cuh).
__device__ unsigned long long g_phase_totals[kWgmmaPhases + 1];
#endif

// kTmaRows (MoeWgmmaParams::tma_rows): A's 128 rows come as one TMA box like the weights, rows
// past the tile's own (the next expert's, or zeros past rows_cap) only feeding output rows that
// are never stored; no thread copies anything.
template <bool kSilu, class R, bool kTmaRows>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles, const __grid_constant__ CUtensorMap weight_map,
                     const __grid_constant__ CUtensorMap rows_map) {
  constexpr int kBK = R::kBK, kStages = R::kStages, kATile = R::kATile, kBTile = R::kBTile;
  constexpr int kStageBytes = R::kStageBytes;
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kWgmmaPhases> clock;
  const int m = static_cast<int>(blockIdx.x / n_tiles), n_tile = static_cast<int>(blockIdx.x % n_tiles);
  MoeTile t;
  if (!block_moe_tile<kBM>(p.expert_offsets, p.num_experts, m, t)) return;

  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // warpgroup: rows [64·wg, 64·wg + 64) of the tile
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  // Each thread copies 16-byte chunk (threadIdx.x % kChunks) of A's tile rows
  // threadIdx.x / kChunks + kRowsPerPass·i; a_src[i] is the row of `in` that A row i holds, -1
  // for zeros (past the segment, padding pairs). Thread 0 has the weight tile brought by TMA:
  // two boxes of 128 rows (the gate and the up rows with SiLU). Rows a box reads past the
  // expert's own (a partial last tile) only feed output columns that are never stored.
  const int chunk = threadIdx.x % R::kChunks, row_in_pass = threadIdx.x / R::kChunks;
  int a_src[R::kPasses];
  if constexpr (!kTmaRows) {
#pragma unroll
    for (int i = 0; i < R::kPasses; ++i) {
      const int r = row_in_pass + R::kRowsPerPass * i, row = t.row0 + r;
      a_src[i] = r < t.rows ? row : -1;
      if (p.sorted_ids && r < t.rows) {
        const int id = p.sorted_ids[row];
        const bool real = id >= 0 && id < p.num_pairs;
        a_src[i] = real ? id / p.in_row_div : -1;
        if (real && p.row_of_pair && n_tile == 0 && chunk == 0) p.row_of_pair[id] = row;
      }
    }
  }
  clock.mark(kWgmmaLookup);
  const int expert_row0 = t.expert * p.n;  // the expert's first row in the weight map
  const int box_row[2] = {expert_row0 + (kSilu ? n_tile * (kBN / 2) : n_tile * kBN),
                          expert_row0 + (kSilu ? half + n_tile * (kBN / 2) : n_tile * kBN + kBN / 2)};

  // Pacing (as kernels/moe_wgmma_fp8.cu): full[s] completes when every thread's cp.async into
  // slot s has landed and the TMA bytes have come; empty[s] when both warpgroups' MMAs on slot s
  // are done. No block-wide barrier in the loop: each warpgroup waits only for its data and for
  // the slot it refills.
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  // full[s]: every thread's cp.async arrival and thread 0's for the TMA bytes; TMA rows: thread 0's
  wgmma::init_ring_barriers(full0, empty0, kStages, kTmaRows ? 1 : kThreads + 1, kThreads);

  const int kt_count = (p.k + kBK - 1) / kBK;
  auto load_stage = [&](int kt) {
    const int slot = kt % kStages, col = kt * kBK + chunk * 8;
    if (threadIdx.x == 0) {
      const uint32_t bar = full0 + slot * 8, b_tile = smem_addr + slot * kStageBytes + kATile;
      wgmma::mbarrier_arrive_expect_tx(bar, kTmaRows ? kATile + kBTile : kBTile);
      if constexpr (kTmaRows) wgmma::tma_load_2d(smem_addr + slot * kStageBytes, &rows_map, kt * kBK, t.row0, bar);
      wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, box_row[0], bar);
      wgmma::tma_load_2d(b_tile + kBTile / 2, &weight_map, kt * kBK, box_row[1], bar);
    }
    if constexpr (!kTmaRows) {
      uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
      for (int i = 0; i < R::kPasses; ++i) {
        const bool ok = col < p.k && a_src[i] >= 0;
        const bf16* src = ok ? p.in + static_cast<size_t>(a_src[i]) * p.k + col : p.in;
        cp_async16(a_tile + wgmma::swizzled_offset<R::kRowBytes>(row_in_pass + R::kRowsPerPass * i, chunk), src,
                   ok ? 16 : 0);
      }
      wgmma::cp_async_mbarrier_arrive(full0 + slot * 8);
    }
  };
  // MoeWgmmaParams::l2_prefetch: the weight boxes of slice kt asked into L2 ahead of their load
  auto prefetch_stage = [&](int kt) {
    if (threadIdx.x == 0 && kt < kt_count) {
      wgmma::tma_prefetch_l2_2d(&weight_map, kt * kBK, box_row[0]);
      wgmma::tma_prefetch_l2_2d(&weight_map, kt * kBK, box_row[1]);
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
    if (s < kt_count) load_stage(s);
  for (int s = kStages - 1; s < kStages - 1 + p.l2_prefetch; ++s) prefetch_stage(s);
  clock.mark(kWgmmaFill);
  for (int kt = 0; kt < kt_count; ++kt) {
    const int slot = kt % kStages;
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
      wgmma::mma_m64n256k16(acc, wgmma::smem_desc_kmajor<R::kRowBytes>(a_addr + kk * 32),
                            wgmma::smem_desc_kmajor<R::kRowBytes>(b_addr + kk * 32), 1);
    wgmma::commit();
    clock.mark(kWgmmaMmaIssue);
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
    wgmma::wait<1>();
    clock.mark(kWgmmaMmaWait);
    if (kt > 0) wgmma::mbarrier_arrive(empty0 + ((kt - 1) % kStages) * 8);
    const int next = kt + kStages - 1;
    if (next < kt_count) {
      if (next >= kStages) wgmma::mbarrier_wait(empty0 + (next % kStages) * 8, (next / kStages - 1) & 1);
      clock.mark(kWgmmaEmptyWait);
      load_stage(next);
      if (p.l2_prefetch > 0) prefetch_stage(next + p.l2_prefetch);
      clock.mark(kWgmmaRefill);
    }
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
  __syncthreads();  // every warpgroup is done with the stages (all copies landed): they hold the output tile now

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
          __floats2bfloat162_rn(g[0] / (1.f + expf(-g[0])) * u[0], g[1] / (1.f + expf(-g[1])) * u[1]);
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[(r + 8) * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(g[2] / (1.f + expf(-g[2])) * u[2], g[3] / (1.f + expf(-g[3])) * u[3]);
    }
  } else {
    stage_bf16_slab(acc, out_tile, kOutPitch, r, c);
  }
  __syncthreads();
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? half : p.n;
  store_tile<kBM, kThreads>(reinterpret_cast<const uint8_t*>(out_tile), kOutPitch * 2, reinterpret_cast<uint8_t*>(p.out),
                            static_cast<size_t>(out_cols) * 2, t.row0, t.rows, n_tile * tile_cols * 2, tile_cols * 2,
                            out_cols * 2);
  clock.mark(kWgmmaEpilogue);
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_phase_totals);
#endif
}

template <bool kSilu, class R, bool kTmaRows>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t blocks = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(blocks < (int64_t{1} << 31), "moe_wgmma: too many tiles");
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma: too many weight rows");
  const CUtensorMap map = tensor_map_2d(p.weight, TmaElement::Bf16, static_cast<int64_t>(p.num_experts) * p.n, p.k,
                                        kBN / 2, R::kRowBytes);
  // without TMA rows the kernel never reads its rows map: the weights' stands in
  const CUtensorMap rows = kTmaRows ? tensor_map_2d(p.in, TmaElement::Bf16, p.rows_cap, p.k, kBM, R::kRowBytes) : map;
  moe_wgmma_kernel<kSilu, R, kTmaRows><<<static_cast<unsigned>(blocks), kThreads, R::kSmemBytes, stream>>>(
      p, n_tiles, map, rows);
  CUDA_CHECK_LAST();
}

template <class R>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  if (p.silu_gate_up)
    p.tma_rows ? launch<true, R, true>(p, stream) : launch<true, R, false>(p, stream);
  else
    p.tma_rows ? launch<false, R, true>(p, stream) : launch<false, R, false>(p, stream);
}

template <class R>
void raise_smem_limits() {
  for (const auto kernel : {moe_wgmma_kernel<true, R, false>, moe_wgmma_kernel<false, R, false>,
                            moe_wgmma_kernel<true, R, true>, moe_wgmma_kernel<false, R, true>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, R::kSmemBytes));
}

#endif  // MOEBATCH_WGMMA

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void moe_wgmma_prepare() {
#if MOEBATCH_WGMMA
  raise_smem_limits<Ring64>();
  raise_smem_limits<Ring32>();
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
  MB_CHECK(p.l2_prefetch >= 0 && p.l2_prefetch <= 64, "moe_wgmma: l2_prefetch is 0..64 slices");
  MB_CHECK(!p.tma_rows || !p.sorted_ids, "moe_wgmma: rows by TMA must be in sorted order already (no gather)");
  MB_CHECK(aligned16(p.out) && aligned16(p.in) && aligned16(p.weight), "moe_wgmma: operands must be 16-byte aligned");
  if (p.rows_cap == 0) return;
#if MOEBATCH_WGMMA
  if (p.deep_ring)
    launch<Ring32>(p, stream);
  else
    launch<Ring64>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_wgmma: this build has no sm_90a code (see moe_wgmma_available)");
#endif
}

}  // namespace moebatch::kernels
