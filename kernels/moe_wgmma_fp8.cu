// W8A8 grouped expert GEMM on Hopper's FP8 tensor cores (kernels/moe_wgmma.cuh,
// MoeWgmmaFp8Params). One block = a 128-row × 256-column tile of one expert's output (device-side
// tile lookup and fused gather, as kernels/moe_wgmma.cu), with e4m3 operands: a 128-byte row is
// 128 values, so one stage of the 4-slot ring is one 128-wide scale group of k, and
// DeepSeek-V3's promotion applies — the tensor cores sum a stage into fresh fp32 registers, which
// are then scaled by the row's and the weight row's scales of that group and added to the fp32
// accumulators (the tensor cores' own accumulation is never trusted across scale groups).
//
// Warp-specialized (DeepGEMM's structure): warpgroup 0 is the producer — thread 0 brings the
// weight tile by TMA, the warpgroup's 128 threads gather the A rows and the scales by cp.async —
// and warpgroups 1 and 2 only multiply and promote, one 64-row slab each. The math warpgroups
// never issue a load or wait for a slot to refill, so the tensor cores see one's MMAs while the
// other promotes; the producer runs up to the whole ring ahead. Registers move from the producer
// (56) to the math warpgroups (224) with setmaxnreg.
//
// Registers decide the shape of the inner loop: 128 accumulators (64 rows × 256 columns per
// warpgroup) plus a stage's partial sums of 64 × 256 would be 256 registers, more than a thread
// has, so each stage runs as two halves of 128 columns (the m64n128k32 instruction), each summed
// into the same 64 partial registers, waited for and promoted before the next.
//
// Built for sm_90a only (MOEBATCH_WGMMA), like moe_wgmma.cu.
#include <cuda_fp8.h>

#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
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

constexpr int kBM = 128;     // rows per block: one 64-row slab per math warpgroup
constexpr int kBN = 256;     // weight rows per block (gate+up: 128 gate rows and the same 128 up rows)
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
constexpr int kTileBytes = kStages * kStageBytes;
constexpr int kSmemBytes = kTileBytes + kStages * kScaleBytes + 1024;  // + slack to align to 1024
constexpr int kOutPitch = kBN + 8;        // bf16 epilogue staging row (elements)
constexpr int kQuantPitch = kHalf + 16;   // e4m3 epilogue staging row (bytes)
static_assert(kBM * kOutPitch * 2 <= kTileBytes && kBM * kQuantPitch <= kTileBytes,
              "the output tile reuses the stages");
constexpr int kRowsPerPass = kWarpgroup / 8;  // A rows one cp.async of each producer thread covers
constexpr float kE4m3Max = 448.f;
constexpr int kMathBarrier = 1;  // named barrier of the math warpgroups (the producer may have left)

// Two e4m3 codes, a's in the low byte (round to nearest, saturating).
__device__ __forceinline__ uint16_t to_e4m3x2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every tile's math warpgroups since the last
// moe_wgmma_fp8_take_phase_clocks (diagnostic builds only: kernels/phase_clock.cuh).
__device__ unsigned long long g_fp8_phase_totals[kFp8Phases + 1];
#endif

// kBlockScales: the weight scales are uniform over aligned 128-row blocks (weight_scale_rows 128
// and the launcher's alignment checks), so each half-tile has one weight scale per stage.
template <bool kSilu, bool kBlockScales>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_fp8_kernel(MoeWgmmaFp8Params p, int n_tiles, const __grid_constant__ CUtensorMap weight_map) {
  extern __shared__ uint8_t smem_raw[];
  PhaseClock<kFp8Phases> clock;
  const int m = static_cast<int>(blockIdx.x / n_tiles), n_tile = static_cast<int>(blockIdx.x % n_tiles);
  MoeTile t;
  if (!block_moe_tile<kBM>(p.expert_offsets, p.num_experts, m, t)) return;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* scale_smem = reinterpret_cast<float*>(smem + kTileBytes);  // [kStages][kBM + kBN]
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // 0: the producer; 1, 2: rows [64·(wg − 1), 64·wg) of the tile
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  const int k_groups = (p.k + kBK - 1) / kBK;
  // A math warpgroup whose 64-row slab lies wholly past the tile's rows (an expert's last tile of
  // ≤ 64 rows) multiplies nothing and never reads a slot: only the other one releases them.
  const int math_wgs = t.rows > kBM / 2 ? 2 : 1;

  // Pacing: full[s] completes when the producer's copies into slot s have landed (one arrival per
  // producer thread, made by its copies, and thread 0's for the TMA bytes); empty[s] when every
  // multiplying thread has finished reading slot s (its MMAs waited for, its scales read).
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, kWarpgroup + 1, math_wgs * kWarpgroup);

  if (wg == 0) {
    // ---- the producer ----
    wgmma::setmaxnreg_dec<kProducerRegs>();
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
    // Thread 0: a stage's weight tile, two boxes of 128 rows (gate and up rows with SiLU).
    auto load_weights = [&](int kt) {
      const int slot = kt % kStages;
      const uint32_t bar = full0 + slot * 8, b_tile = smem_addr + slot * kStageBytes + kATile;
      wgmma::mbarrier_arrive_expect_tx(bar, kBTile);
      wgmma::tma_load_2d(b_tile, &weight_map, kt * kBK, box_row0, bar);
      wgmma::tma_load_2d(b_tile + kHalf * kBK, &weight_map, kt * kBK, box_row1, bar);
    };
    // The weights need only the expert: the first stages' are on their way before the rows'
    // ids are looked up (a dependent global load of its own).
    if (threadIdx.x == 0)
      for (int s = 0; s < kStages && s < k_groups; ++s) load_weights(s);

    // Each thread copies 16-byte chunk `chunk` of A's tile rows row_in_pass + 16·i, the scale of
    // tile row threadIdx.x and (per-row scales) those of weight rows threadIdx.x and
    // threadIdx.x + 128, or (block scales, threads 0 and 1) that of half threadIdx.x's rows. Zeros
    // past the segment, for padding pairs and past the expert's weight rows.
    const int chunk = threadIdx.x & 7, row_in_pass = threadIdx.x >> 3;
    // id of tile row r: its pair (sorted_ids), or its row of `in`; -1 past the segment
    auto row_id = [&](int r) { return r >= t.rows ? -1 : p.sorted_ids ? p.sorted_ids[t.row0 + r] : t.row0 + r; };
    // the row of `in` an id names, -1 for zeros (past the segment, padding pairs)
    auto source = [&](int id) { return !p.sorted_ids ? id : id >= 0 && id < p.num_pairs ? id / p.in_row_div : -1; };
    // every id is loaded before the row_of_pair store, which the compiler must otherwise assume
    // may alias sorted_ids
    int a_src[kBM / kRowsPerPass];
#pragma unroll
    for (int i = 0; i < kBM / kRowsPerPass; ++i) a_src[i] = row_id(row_in_pass + kRowsPerPass * i);
    const int own_id = row_id(threadIdx.x);
#pragma unroll
    for (int i = 0; i < kBM / kRowsPerPass; ++i) a_src[i] = source(a_src[i]);
    const int scale_src = source(own_id);
    if (p.sorted_ids && p.row_of_pair && n_tile == 0 && own_id >= 0 && own_id < p.num_pairs)
      p.row_of_pair[own_id] = t.row0 + threadIdx.x;
    const float* ws_expert = p.weight_scales + static_cast<size_t>(t.expert) * p.n * k_groups;
    const float* sa_src = scale_src >= 0 ? p.in_scales + static_cast<size_t>(scale_src) * k_groups : nullptr;
    const int wrow0 = kBlockScales ? (threadIdx.x < 2 ? weight_row(threadIdx.x * kHalf) : -1) : weight_row(threadIdx.x);
    const int wrow1 = kBlockScales ? -1 : weight_row(threadIdx.x + kWarpgroup);
    const float* sb_src0 = wrow0 >= 0 ? ws_expert + static_cast<size_t>(wrow0) * k_groups : nullptr;
    const float* sb_src1 = wrow1 >= 0 ? ws_expert + static_cast<size_t>(wrow1) * k_groups : nullptr;

    for (int kt = 0; kt < k_groups; ++kt) {
      const int slot = kt % kStages;
      if (kt >= kStages) {
        wgmma::mbarrier_wait(empty0 + slot * 8, (kt / kStages - 1) & 1);
        if (threadIdx.x == 0) load_weights(kt);
      }
      const int col = kt * kBK + chunk * 16;
      uint8_t* a_tile = smem + slot * kStageBytes;
#pragma unroll
      for (int i = 0; i < kBM / kRowsPerPass; ++i) {
        const bool ok = col < p.k && a_src[i] >= 0;
        const uint8_t* src = ok ? p.in + static_cast<size_t>(a_src[i]) * p.k + col : p.in;
        cp_async16(a_tile + wgmma::sw128_offset(row_in_pass + kRowsPerPass * i, chunk), src, ok ? 16 : 0);
      }
      float* scales = scale_smem + slot * (kBM + kBN);
      cp_async4(&scales[threadIdx.x], sa_src ? sa_src + kt : p.in_scales, sa_src ? 4 : 0);
      if (!kBlockScales || threadIdx.x < 2)
        cp_async4(&scales[kBM + threadIdx.x], sb_src0 ? sb_src0 + kt : p.weight_scales, sb_src0 ? 4 : 0);
      if constexpr (!kBlockScales)
        cp_async4(&scales[kBM + kWarpgroup + threadIdx.x], sb_src1 ? sb_src1 + kt : p.weight_scales, sb_src1 ? 4 : 0);
      wgmma::cp_async_mbarrier_arrive(full0 + slot * 8);
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy of this thread in flight
    return;
  }

  // ---- the math warpgroups ----
  wgmma::setmaxnreg_inc<kMathRegs>();
  const int slab = wg - 1;
  const int lane = threadIdx.x & 31, math_thread = threadIdx.x - kWarpgroup;
  // This thread's accumulator rows (kernels/wgmma.cuh layout) within the tile, and column offset.
  const int r0 = slab * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c0 = 2 * (lane & 3);

  float acc[128];    // wgmma layout of a 64 × 256 slab: half h's sums at [64h, 64h + 64)
  float part[64];    // one half's sums over one stage
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = acc[64 + i] = part[i] = 0.f;
  clock.mark(kFp8Tile);

  if (slab < math_wgs) {
    for (int kt = 0; kt < k_groups; ++kt) {
      const int slot = kt % kStages;
      wgmma::mbarrier_wait(full0 + slot * 8, (kt / kStages) & 1);
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
        for (int i = 0; i < 64; ++i) wgmma::fence_operand(part[i]);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk)
          wgmma::mma_m64n128k32_e4m3(part, wgmma::smem_desc_sw128(a_addr + kk * 32),
                                     wgmma::smem_desc_sw128(b_addr + h * (kHalf * kBK) + kk * 32), kk > 0);
        wgmma::commit();
        clock.mark(kFp8MmaIssue);
        wgmma::wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) wgmma::fence_operand(part[i]);
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
  }
  // both math warpgroups are done with the stages (every copy landed: they waited for all):
  // they hold the output tile now
  named_barrier_sync<kMathBarrier, kMathThreads>();
  clock.mark(kFp8Drain);

  if constexpr (kSilu) {
    // silu(gate)·up, then per row of this tile's 128 output columns (one scale group, held by
    // the 4 lanes of a quad) amax → scale → e4m3 codes, staged as bytes and stored 16 at a time.
    // Columns past `half` (a partial last tile) hold what the gate box read past the gate rows:
    // zero them before they reach the group's amax.
    float v[64], amax0 = 0.f, amax1 = 0.f;
    // silu(g) = g / (1 + e^-g), two values to one reciprocal (1/(d0·d1)); e^-g is taken at
    // g ≥ -40 so that d0·d1 stays finite (below, silu is under 2e-16 either way)
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const float g0 = acc[i], g1 = acc[i + 1];
      const float d0 = 1.f + __expf(-fmaxf(g0, -40.f)), d1 = 1.f + __expf(-fmaxf(g1, -40.f));
      const float r = __fdividef(1.f, d0 * d1);
      const bool real0 = n_tile * kHalf + 8 * (i / 4) + c0 < half;  // both columns or neither
      v[i] = real0 ? g0 * d1 * r * acc[64 + i] : 0.f;
      v[i + 1] = real0 ? g1 * d0 * r * acc[64 + i + 1] : 0.f;
      if ((i & 2) == 0) {
        amax0 = fmaxf(amax0, fmaxf(fabsf(v[i]), fabsf(v[i + 1])));
      } else {
        amax1 = fmaxf(amax1, fmaxf(fabsf(v[i]), fabsf(v[i + 1])));
      }
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      amax0 = fmaxf(amax0, __shfl_xor_sync(~0u, amax0, d));
      amax1 = fmaxf(amax1, __shfl_xor_sync(~0u, amax1, d));
    }
    const float scale0 = amax0 > 0.f ? amax0 / kE4m3Max : 1.f, scale1 = amax1 > 0.f ? amax1 / kE4m3Max : 1.f;
    const float inv0 = 1.f / scale0, inv1 = 1.f / scale1;
    uint8_t* out_tile = smem;
#pragma unroll
    for (int j = 0; j < kHalf / 8; ++j) {
      const int c = 8 * j + c0;
      *reinterpret_cast<uint16_t*>(&out_tile[r0 * kQuantPitch + c]) = to_e4m3x2(v[4 * j] * inv0, v[4 * j + 1] * inv0);
      *reinterpret_cast<uint16_t*>(&out_tile[(r0 + 8) * kQuantPitch + c]) =
          to_e4m3x2(v[4 * j + 2] * inv1, v[4 * j + 3] * inv1);
    }
    const int groups = (half + kWgmmaFp8Group - 1) / kWgmmaFp8Group;
    if ((lane & 3) == 0) {
      if (r0 < t.rows) p.out_scales[static_cast<size_t>(t.row0 + r0) * groups + n_tile] = scale0;
      if (r0 + 8 < t.rows) p.out_scales[static_cast<size_t>(t.row0 + r0 + 8) * groups + n_tile] = scale1;
    }
    named_barrier_sync<kMathBarrier, kMathThreads>();
    store_tile<kBM, kMathThreads>(out_tile, kQuantPitch, static_cast<uint8_t*>(p.out), static_cast<size_t>(half),
                                  t.row0, t.rows, n_tile * kHalf, kHalf, half, math_thread);
  } else {
    // Accumulators → bf16 tile in shared memory, then 16-byte rows out.
    bf16* out_tile = reinterpret_cast<bf16*>(smem);
    stage_bf16_slab(acc, out_tile, kOutPitch, r0, c0);
    named_barrier_sync<kMathBarrier, kMathThreads>();
    store_tile<kBM, kMathThreads>(smem, kOutPitch * 2, static_cast<uint8_t*>(p.out), static_cast<size_t>(p.n) * 2,
                                  t.row0, t.rows, n_tile * kBN * 2, kBN * 2, p.n * 2, math_thread);
  }
  clock.mark(kFp8Epilogue);
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_fp8_phase_totals);
#endif
}

template <bool kSilu, bool kBlockScales>
void launch(const MoeWgmmaFp8Params& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kHalf : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t blocks = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(blocks < (int64_t{1} << 31), "moe_wgmma_fp8: too many tiles");
  const CUtensorMap map = tensor_map_2d(p.weight, TmaElement::U8, static_cast<int64_t>(p.num_experts) * p.n, p.k, kHalf);
  moe_wgmma_fp8_kernel<kSilu, kBlockScales><<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(p, n_tiles, map);
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
