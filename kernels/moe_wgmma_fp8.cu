// W8A8 grouped expert GEMM on Hopper's FP8 tensor cores (kernels/moe_wgmma.cuh,
// MoeWgmmaFp8Params). Tiles of 128 rows × 256 columns of one expert's output (device-side tile
// lookup and fused gather, as kernels/moe_wgmma.cu), one persistent block per SM walking them,
// with e4m3 operands: a 128-byte row is
// 128 values, so one stage of the 4-slot ring is one 128-wide scale group of k, and
// DeepSeek-V3's promotion applies — the tensor cores sum a stage into fresh fp32 registers, which
// are then scaled by the row's and the weight row's scales of that group and added to the fp32
// accumulators (the tensor cores' own accumulation is never trusted across scale groups).
//
// Warp-specialized (DeepGEMM's structure): warpgroup 0 is the producer — thread 0 brings the
// weight tile by TMA, the warpgroup's 128 threads gather the A rows and the scales by cp.async —
// and warpgroups 1 and 2 only multiply and promote, one 64-row slab each. The math warpgroups
// never issue a load or wait for a slot to refill, so the tensor cores see one's MMAs while the
// other promotes; the producer runs up to the whole ring ahead, across tiles: the next tile's
// lookup, ids and first stages go on under this tile's last stages and epilogue. Registers move
// from the producer (56) to the math warpgroups (224) with setmaxnreg.
//
// Registers decide the shape of the inner loop: 128 accumulators (64 rows × 256 columns per
// warpgroup) plus a stage's partial sums of 64 × 256 would be 256 registers, more than a thread
// has, so each stage runs as two halves of 128 columns (the m64n128k32 instruction), each summed
// into the same 64 partial registers, waited for and promoted before the next.
//
// Built for sm_90a only (MOEBATCH_WGMMA), like moe_wgmma.cu.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_tile_ring.cuh"
#include "kernels/moe_tiles.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/phase_clock.cuh"
#include "kernels/tensor_map.cuh"
#if MOEBATCH_WGMMA
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

#if MOEBATCH_WGMMA

constexpr int kBM = 128;     // rows per tile: one 64-row slab per math warpgroup
constexpr int kBN = 256;     // weight rows per tile (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kHalf = 128;   // columns per MMA half (m64n128k32)
constexpr int kBK = kWgmmaFp8Group;  // k per stage: one 128-byte swizzled row = one scale group
constexpr int kStages = 4;
constexpr int kWarpgroup = 128;
constexpr int kMathThreads = 2 * kWarpgroup;           // warpgroups 1 and 2
constexpr int kThreads = kWarpgroup + kMathThreads;    // and the producer, warpgroup 0
// The block starts at 168 registers a thread (65,536 / 384); the producer gives back to 56 so
// that the math warpgroups can hold 224 (acc 128 + partial sums 64 + addressing; the producer
// spills at 40).
constexpr int kProducerRegs = 56, kMathRegs = 224;
static_assert(kProducerRegs + 2 * kMathRegs <= 3 * (65536 / kThreads / 8 * 8), "setmaxnreg budget");
constexpr int kATile = kBM * kBK;  // bytes; multiples of 1024 keep every tile aligned
constexpr int kBTile = kBN * kBK;
constexpr int kStageBytes = kATile + kBTile;
constexpr int kScaleBytes = (kBM + kBN) * 4;  // a stage's row scales, then its weight-row scales
constexpr int kRingBytes = kStages * kStageBytes;
constexpr int kQuantPitch = kHalf + 16;   // e4m3 epilogue staging row (bytes)
constexpr int kStagingBytes = kBM * kQuantPitch;  // gate+up's output tile, beside the ring
// + slack to align the ring to 1024
constexpr int kSmemBytes = kRingBytes + kStages * kScaleBytes + kStagingBytes + 1024;
static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
constexpr int kRowsPerPass = kWarpgroup / 8;  // A rows one cp.async of each producer thread covers
constexpr float kE4m3Max = 448.f;
constexpr int kMathBarrier = 1;      // named barrier of the math warpgroups
constexpr int kProducerBarrier = 2;  // named barrier of the producer warpgroup

// Two e4m3 codes, a's in the low byte (round to nearest, saturating).
__device__ __forceinline__ uint16_t to_e4m3x2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

/// One tile of a block's walk, handed from the producer to the math warpgroups.
#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile's math warpgroups since the last
// moe_wgmma_fp8_take_phase_clocks (diagnostic builds only: kernels/phase_clock.cuh).
__device__ unsigned long long g_fp8_phase_totals[kFp8Phases + 1];
#endif

// Persistent: block b takes the walk's tiles b, b + G, … (G = gridDim.x; tile w is row tile
// w / n_tiles, column tile w % n_tiles) until the row tiles end. The producer runs on into the
// next tile — its lookup, its rows' ids, its first stages — while the math warpgroups finish
// this one and write its epilogue, so neither the fill nor the epilogue stops the tensor cores.
// kBlockScales: the weight scales are uniform over aligned 128-row blocks (weight_scale_rows 128
// and the launcher's alignment checks), so each half-tile has one weight scale per stage.
template <bool kSilu, bool kBlockScales>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_fp8_kernel(MoeWgmmaFp8Params p, int n_tiles, int64_t walk_len,
                         const __grid_constant__ CUtensorMap weight_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kFp8Phases> clock;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* scale_smem = reinterpret_cast<float*>(smem + kRingBytes);  // [kStages][kBM + kBN]
  uint8_t* staging = smem + kRingBytes + kStages * kScaleBytes;    // gate+up's e4m3 output tile
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // 0: the producer; 1, 2: rows [64·(wg − 1), 64·wg) of a tile
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  const int k_groups = (p.k + kBK - 1) / kBK;

  // Pacing of the ring (stages numbered across the block's tiles, s = 0, 1, …; slot s % kStages):
  // full[slot] completes when the producer's copies of a stage have landed (one arrival per
  // producer thread, made by its copies, and thread 0's for the TMA bytes); empty[slot] when both
  // math warpgroups have finished reading it (a warpgroup with no rows in a tile arrives without
  // reading). The tiles' identities pass through a ring of two TileInfo entries
  // (kernels/moe_tile_ring.cuh).
  __shared__ __align__(8) uint64_t bars[2 * kStages + 4];
  __shared__ TileInfo info[2];
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  const TileRing tiles_ring{info, empty0 + kStages * 8, empty0 + (kStages + 2) * 8};
  if (threadIdx.x == 0) tiles_ring.init(kMathThreads);
  wgmma::init_ring_barriers(full0, empty0, kStages, kWarpgroup + 1, kMathThreads);  // and the block meets

  if (wg == 0) {
    // ---- the producer ----
    wgmma::setmaxnreg_dec<kProducerRegs>();
    const int chunk = threadIdx.x & 7, row_in_pass = threadIdx.x >> 3;
    int s = 0;  // the block's stage count
    for (int i = 0;; ++i) {
      const int e = i & 1;
      if (threadIdx.x < 32) tiles_ring.publish<kBM>(i, walk_len, n_tiles, p.expert_offsets, p.num_experts);
      named_barrier_sync<kProducerBarrier, kWarpgroup>();  // the producer reads info[e]
      if (!info[e].valid) break;
      const MoeTile t = info[e].tile;
      const int n_tile = info[e].n_tile;

      // Weight row of tile row r (0..kBN-1), -1 past the expert's rows.
      auto weight_row = [&](int r) {
        if constexpr (kSilu) {
          const int c = n_tile * kHalf + (r & (kHalf - 1));
          return c < half ? (r < kHalf ? c : half + c) : -1;
        } else {
          const int c = n_tile * kBN + r;
          return c < p.n ? c : -1;
        }
      };
      const int expert_row0 = t.expert * p.n;  // the expert's first row in the weight map
      const int box_row0 = expert_row0 + (kSilu ? n_tile * kHalf : n_tile * kBN);
      const int box_row1 = expert_row0 + (kSilu ? half + n_tile * kHalf : n_tile * kBN + kHalf);
      // Each thread copies 16-byte chunk `chunk` of A's tile rows row_in_pass + 16·i, the scale
      // of tile row threadIdx.x and (per-row scales) those of weight rows threadIdx.x and
      // threadIdx.x + 128, or (block scales, threads 0 and 1) that of half threadIdx.x's rows.
      // Zeros past the segment, for padding pairs and past the expert's weight rows.
      // id of tile row r: its pair (sorted_ids), or its row of `in`; -1 past the segment
      auto row_id = [&](int r) { return r >= t.rows ? -1 : p.sorted_ids ? p.sorted_ids[t.row0 + r] : t.row0 + r; };
      // the row of `in` an id names, -1 for zeros (past the segment, padding pairs)
      auto source = [&](int id) { return !p.sorted_ids ? id : id >= 0 && id < p.num_pairs ? id / p.in_row_div : -1; };
      // every id is loaded before the row_of_pair store, which the compiler must otherwise
      // assume may alias sorted_ids
      int a_src[kBM / kRowsPerPass];
#pragma unroll
      for (int r = 0; r < kBM / kRowsPerPass; ++r) a_src[r] = row_id(row_in_pass + kRowsPerPass * r);
      const int own_id = row_id(threadIdx.x);
#pragma unroll
      for (int r = 0; r < kBM / kRowsPerPass; ++r) a_src[r] = source(a_src[r]);
      const int scale_src = source(own_id);
      if (p.sorted_ids && p.row_of_pair && n_tile == 0 && own_id >= 0 && own_id < p.num_pairs)
        p.row_of_pair[own_id] = t.row0 + threadIdx.x;
      const float* ws_expert = p.weight_scales + static_cast<size_t>(t.expert) * p.n * k_groups;
      const float* sa_src = scale_src >= 0 ? p.in_scales + static_cast<size_t>(scale_src) * k_groups : nullptr;
      const int wrow0 = kBlockScales ? (threadIdx.x < 2 ? weight_row(threadIdx.x * kHalf) : -1) : weight_row(threadIdx.x);
      const int wrow1 = kBlockScales ? -1 : weight_row(threadIdx.x + kWarpgroup);
      const float* sb_src0 = wrow0 >= 0 ? ws_expert + static_cast<size_t>(wrow0) * k_groups : nullptr;
      const float* sb_src1 = wrow1 >= 0 ? ws_expert + static_cast<size_t>(wrow1) * k_groups : nullptr;

      for (int kt = 0; kt < k_groups; ++kt, ++s) {
        const int slot = s % kStages;
        if (s >= kStages) wgmma::mbarrier_wait(empty0 + slot * 8, (s / kStages - 1) & 1);
        if (threadIdx.x == 0) {
          const uint32_t bar = full0 + slot * 8, b_tile = smem_addr + slot * kStageBytes + kATile;
          wgmma::mbarrier_arrive_expect_tx(bar, kBTile);
          wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, box_row0, bar);
          wgmma::tma_load_2d(b_tile + kHalf * kBK, &weight_map, kt * kBK, box_row1, bar);
        }
        const int col = kt * kBK + chunk * 16;
        uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
        for (int r = 0; r < kBM / kRowsPerPass; ++r) {
          const bool ok = col < p.k && a_src[r] >= 0;
          const uint8_t* src = ok ? p.in + static_cast<size_t>(a_src[r]) * p.k + col : p.in;
          cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * r, chunk), src, ok ? 16 : 0);
        }
        float* scales = scale_smem + slot * (kBM + kBN);
        cp_async4(&scales[threadIdx.x], sa_src ? sa_src + kt : p.in_scales, sa_src ? 4 : 0);
        if (!kBlockScales || threadIdx.x < 2)
          cp_async4(&scales[kBM + threadIdx.x], sb_src0 ? sb_src0 + kt : p.weight_scales, sb_src0 ? 4 : 0);
        if constexpr (!kBlockScales)
          cp_async4(&scales[kBM + kWarpgroup + threadIdx.x], sb_src1 ? sb_src1 + kt : p.weight_scales, sb_src1 ? 4 : 0);
        wgmma::cp_async_mbarrier_arrive(full0 + slot * 8);
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy of this thread in flight
    return;
  }

  // ---- the math warpgroups ----
  wgmma::setmaxnreg_inc<kMathRegs>();
  const int slab = wg - 1;
  const int lane = threadIdx.x & 31, math_thread = threadIdx.x - kWarpgroup;
  // This thread's accumulator rows (kernels/wgmma.cuh layout) within a tile, and column offset.
  const int r0 = slab * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c0 = 2 * (lane & 3);
  float acc[128];    // wgmma layout of a 64 × 256 slab: half h's sums at [64h, 64h + 64)
  float part[64];    // one half's sums over one stage
#pragma unroll
  for (int i = 0; i < 64; ++i) part[i] = 0.f;
  int s = 0;  // the block's stage count, as the producer's
  int tiles = 0;
  for (int i = 0;; ++i) {
    const TileInfo ti = tiles_ring.take(i);
    if (!ti.valid) break;
    const MoeTile& t = ti.tile;
    const int n_tile = ti.n_tile;
#pragma unroll
    for (int j = 0; j < 128; ++j) acc[j] = 0.f;
    clock.mark(kFp8Tile);

    // A math warpgroup whose 64-row slab lies wholly past the tile's rows (an expert's last tile
    // of ≤ 64 rows) multiplies nothing: it only releases each stage once it has landed (so that
    // its arrivals stay in that stage's phase).
    if (slab * (kBM / 2) < t.rows) {
      for (int kt = 0; kt < k_groups; ++kt, ++s) {
        const int slot = s % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (s / kStages) & 1);
        clock.mark(kFp8FullWait);
        // the A rows were copied by the generic proxy; the tensor cores read through the async one
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");

        const uint32_t a_addr = smem_addr + slot * kStageBytes + slab * (kATile / 2);
        const uint32_t b_addr = smem_addr + slot * kStageBytes + kATile;
        const float* scales = scale_smem + slot * (kBM + kBN);
        const float sa0 = scales[r0], sa1 = scales[r0 + 8];
        const float sb_block[2] = {kBlockScales ? scales[kBM] : 0.f, kBlockScales ? scales[kBM + 1] : 0.f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int j = 0; j < 64; ++j) wgmma::fence_operand(part[j]);
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < kBK / 32; ++kk)
            wgmma::mma_m64n128k32_e4m3(part, wgmma::smem_desc_sw128(a_addr + kk * 32),
                                       wgmma::smem_desc_sw128(b_addr + h * (kHalf * kBK) + kk * 32), kk > 0);
          wgmma::commit();
          clock.mark(kFp8MmaIssue);
          wgmma::wait<0>();
#pragma unroll
          for (int j = 0; j < 64; ++j) wgmma::fence_operand(part[j]);
          clock.mark(kFp8MmaWait);
          // block scales: the slot is read in full (its scales are in registers) once the second
          // half's MMAs are done; release it before the promotion
          if (kBlockScales && h == 1) wgmma::mbarrier_arrive(empty0 + slot * 8);
          // promotion: this stage's sums times the row scale and the weight row's scale
          if constexpr (kBlockScales) {
            const float sb = sb_block[h], s0 = sa0 * sb, s1 = sa1 * sb;
#pragma unroll
            for (int j = 0; j < kHalf / 8; ++j) {
              acc[64 * h + 4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[64 * h + 4 * j + 0]);
              acc[64 * h + 4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[64 * h + 4 * j + 1]);
              acc[64 * h + 4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[64 * h + 4 * j + 2]);
              acc[64 * h + 4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[64 * h + 4 * j + 3]);
            }
          } else {
#pragma unroll
            for (int j = 0; j < kHalf / 8; ++j) {
              const float2 sb = *reinterpret_cast<const float2*>(&scales[kBM + h * kHalf + 8 * j + c0]);
              acc[64 * h + 4 * j + 0] = fmaf(part[4 * j + 0], sa0 * sb.x, acc[64 * h + 4 * j + 0]);
              acc[64 * h + 4 * j + 1] = fmaf(part[4 * j + 1], sa0 * sb.y, acc[64 * h + 4 * j + 1]);
              acc[64 * h + 4 * j + 2] = fmaf(part[4 * j + 2], sa1 * sb.x, acc[64 * h + 4 * j + 2]);
              acc[64 * h + 4 * j + 3] = fmaf(part[4 * j + 3], sa1 * sb.y, acc[64 * h + 4 * j + 3]);
            }
          }
          clock.mark(kFp8Promote);
        }
        if (!kBlockScales) wgmma::mbarrier_arrive(empty0 + slot * 8);
      }
    } else {
      for (int kt = 0; kt < k_groups; ++kt, ++s) {
        const int slot = s % kStages;
        wgmma::mbarrier_wait(full0 + slot * 8, (s / kStages) & 1);
        wgmma::mbarrier_arrive(empty0 + slot * 8);
      }
      clock.mark(kFp8FullWait);
    }

    if constexpr (kSilu) {
      // silu(gate)·up, then per row of this tile's 128 output columns (one scale group, held by
      // the 4 lanes of a quad) amax → scale → e4m3 codes, staged as bytes beside the ring and
      // stored 16 at a time. Columns past `half` (a partial last tile) hold what the gate box read
      // past the gate rows: zero them before they reach the group's amax.
      float v[64], amax0 = 0.f, amax1 = 0.f;
      // silu(g) = g / (1 + e^-g), two values to one reciprocal (1/(d0·d1)); e^-g is taken at
      // g ≥ -40 so that d0·d1 stays finite (below, silu is under 2e-16 either way)
#pragma unroll
      for (int j = 0; j < 64; j += 2) {
        const float g0 = acc[j], g1 = acc[j + 1];
        const float d0 = 1.f + __expf(-fmaxf(g0, -40.f)), d1 = 1.f + __expf(-fmaxf(g1, -40.f));
        const float r = __fdividef(1.f, d0 * d1);
        const bool real = n_tile * kHalf + 8 * (j / 4) + c0 < half;  // both columns or neither
        v[j] = real ? g0 * d1 * r * acc[64 + j] : 0.f;
        v[j + 1] = real ? g1 * d0 * r * acc[64 + j + 1] : 0.f;
        if ((j & 2) == 0) {
          amax0 = fmaxf(amax0, fmaxf(fabsf(v[j]), fabsf(v[j + 1])));
        } else {
          amax1 = fmaxf(amax1, fmaxf(fabsf(v[j]), fabsf(v[j + 1])));
        }
      }
#pragma unroll
      for (int d = 1; d <= 2; d <<= 1) {
        amax0 = fmaxf(amax0, __shfl_xor_sync(~0u, amax0, d));
        amax1 = fmaxf(amax1, __shfl_xor_sync(~0u, amax1, d));
      }
      const float scale0 = amax0 > 0.f ? amax0 / kE4m3Max : 1.f, scale1 = amax1 > 0.f ? amax1 / kE4m3Max : 1.f;
      const float inv0 = 1.f / scale0, inv1 = 1.f / scale1;
      const int groups = (half + kWgmmaFp8Group - 1) / kWgmmaFp8Group;
      if ((lane & 3) == 0) {
        if (r0 < t.rows) p.out_scales[static_cast<size_t>(t.row0 + r0) * groups + n_tile] = scale0;
        if (r0 + 8 < t.rows) p.out_scales[static_cast<size_t>(t.row0 + r0 + 8) * groups + n_tile] = scale1;
      }
      named_barrier_sync<kMathBarrier, kMathThreads>();  // the previous tile's stores have read the staging
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j) {
        const int c = 8 * j + c0;
        *reinterpret_cast<uint16_t*>(&staging[r0 * kQuantPitch + c]) = to_e4m3x2(v[4 * j] * inv0, v[4 * j + 1] * inv0);
        *reinterpret_cast<uint16_t*>(&staging[(r0 + 8) * kQuantPitch + c]) =
            to_e4m3x2(v[4 * j + 2] * inv1, v[4 * j + 3] * inv1);
      }
      named_barrier_sync<kMathBarrier, kMathThreads>();
      store_tile<kBM, kMathThreads>(staging, kQuantPitch, static_cast<uint8_t*>(p.out), static_cast<size_t>(half),
                                    t.row0, t.rows, n_tile * kHalf, kHalf, half, math_thread);
    } else {
      // bf16 through the staging buffer, each math warp its own 16 rows (2 KB of it, a 64-column
      // quarter a pass): a 128 × 256 bf16 tile (64 KB) does not fit beside the ring, and the warp
      // needs no one else, so the 16-byte stores go out without a block-wide barrier
      constexpr int kQuarterPitch = 64 * 2 + 16;  // bytes: 64 bf16 columns and 16 of padding
      static_assert(kMathThreads / 32 * 16 * kQuarterPitch <= kStagingBytes, "a warp's quarter tile");
      const int warp = math_thread >> 5, warp_row0 = 16 * warp;  // the warp's rows r0 - (lane >> 2) of the tile
      uint8_t* quarter = staging + warp * 16 * kQuarterPitch;
      const int out_bytes = p.n * 2;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int a = 4 * (8 * q + j);  // accumulators of columns 64q + 8j + c0, + 1
          *reinterpret_cast<__nv_bfloat162*>(&quarter[(lane >> 2) * kQuarterPitch + (8 * j + c0) * 2]) =
              __floats2bfloat162_rn(acc[a], acc[a + 1]);
          *reinterpret_cast<__nv_bfloat162*>(&quarter[((lane >> 2) + 8) * kQuarterPitch + (8 * j + c0) * 2]) =
              __floats2bfloat162_rn(acc[a + 2], acc[a + 3]);
        }
        __syncwarp();
        // 16 rows × 8 chunks of 16 bytes, 4 a lane
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int chunk = lane + 32 * i, row = chunk >> 3, col_bytes = (n_tile * kBN + 64 * q) * 2 + (chunk & 7) * 16;
          if (warp_row0 + row < t.rows && col_bytes < out_bytes)
            *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.out) +
                                      static_cast<size_t>(t.row0 + warp_row0 + row) * out_bytes + col_bytes) =
                *reinterpret_cast<const uint4*>(&quarter[row * kQuarterPitch + (chunk & 7) * 16]);
        }
        __syncwarp();  // read before the next quarter overwrites it
      }
    }
    clock.mark(kFp8Epilogue);
    ++tiles;
  }
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_fp8_phase_totals, tiles);
#endif
}

template <bool kSilu, bool kBlockScales>
void launch(const MoeWgmmaFp8Params& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kHalf : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t walk_len = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // one per SM: the kernel is persistent
  const int blocks = static_cast<int>(std::min<int64_t>(p.max_blocks > 0 ? std::min(sms, p.max_blocks) : sms, walk_len));
  const CUtensorMap map = tensor_map_2d(p.weight, TmaElement::U8, static_cast<int64_t>(p.num_experts) * p.n, p.k, kHalf);
  moe_wgmma_fp8_kernel<kSilu, kBlockScales><<<blocks, kThreads, kSmemBytes, stream>>>(p, n_tiles, walk_len, map);
  CUDA_CHECK_LAST();
}
#endif  // MOEBATCH_WGMMA

}  // namespace

namespace detail {
void moe_wgmma_fp8_prepare() {
#if MOEBATCH_WGMMA
  for (const void* kernel : {reinterpret_cast<const void*>(moe_wgmma_fp8_kernel<true, false>),
                             reinterpret_cast<const void*>(moe_wgmma_fp8_kernel<false, false>),
                             reinterpret_cast<const void*>(moe_wgmma_fp8_kernel<true, true>),
                             reinterpret_cast<const void*>(moe_wgmma_fp8_kernel<false, true>)})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
#endif
}
}  // namespace detail

std::vector<uint64_t> moe_wgmma_fp8_take_phase_clocks() {
#if MOEBATCH_WGMMA && MOEBATCH_PHASE_CLOCKS
  return take_phase_totals(g_fp8_phase_totals);
#else
  return {};
#endif
}

void moe_wgmma_fp8(const MoeWgmmaFp8Params& p, cudaStream_t stream) {
  const int out_cols = p.silu_gate_up ? p.n / 2 : p.n;
  MB_CHECK(p.num_experts > 0 && p.n > 0 && p.k > 0 && p.rows_cap >= 0, "moe_wgmma_fp8: bad shape");
  MB_CHECK(out_cols % 16 == 0 && p.k % 16 == 0 && (!p.silu_gate_up || p.n % 2 == 0),
           "moe_wgmma_fp8: output columns and k must be multiples of 16");
  MB_CHECK(p.out && p.in && p.in_scales && p.weight && p.weight_scales && p.expert_offsets &&
               (!p.silu_gate_up || p.out_scales),
           "moe_wgmma_fp8: null operand");
  MB_CHECK(!p.sorted_ids || (p.num_pairs >= 0 && p.in_row_div > 0), "moe_wgmma_fp8: bad gather");
  MB_CHECK(static_cast<int64_t>(p.num_experts) * p.n < (int64_t{1} << 31), "moe_wgmma_fp8: too many weight rows");
  MB_CHECK(aligned16(p.out) && aligned16(p.in) && aligned16(p.weight),
           "moe_wgmma_fp8: operands must be 16-byte aligned");
  if (p.rows_cap == 0) return;
#if MOEBATCH_WGMMA
  // Block scales need each half-tile inside one aligned 128-row block: experts and (with SiLU)
  // the up rows must start on one.
  const bool block = p.weight_scale_rows == kWgmmaFp8Group && p.n % kWgmmaFp8Group == 0 &&
                     (!p.silu_gate_up || (p.n / 2) % kWgmmaFp8Group == 0);
  if (p.silu_gate_up)
    block ? launch<true, true>(p, stream) : launch<true, false>(p, stream);
  else
    block ? launch<false, true>(p, stream) : launch<false, false>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_wgmma_fp8: this build has no sm_90a code (see moe_wgmma_available)");
#endif
}

}  // namespace moebatch::kernels
