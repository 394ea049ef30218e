// Causal paged attention for prefill on Hopper's warpgroup MMA (the contract of
// kernels/attention.cuh; kernels/attention.cu decides when this kernel runs).
//
// A block owns 128 rows of one sequence and one kv head — a row being (query token, head of the
// kv group), heads inner, as in the mma.sync kernel — as two warpgroups of 64 rows. Per tile of
// keys (128 at head_dim 128, 64 at head_dim 256: Tiles<D>):
//   S = Q·Kᵀ    wgmma m64nKEYSk16, Q and K both K-major in shared memory (head_dim / 16 MMAs);
//   softmax     online, in fp32 registers (base 2; a row's keys / 4 scores per thread, max and sum
//               over the quad of lanes sharing the row); P rounded to bf16 in registers;
//   O += P·V    wgmma m64nDk16 with P as the register A operand (a 16-column slice of the S
//               accumulators is exactly an A fragment) and V N-major in shared memory, i.e. the
//               rows of the tile as they come from the cache (no transpose pass).
// The next tile's S is issued right after this tile's P·V, so the tensor cores run P·V(t) and
// S(t + 1) back to back while the warpgroup waits, and the other warpgroup's softmax fills the
// gaps. K/V tiles go through a ring of stages (three at head_dim 128: tile t + 2 lands while t
// is multiplied; two at 256), brought by the second warpgroup: whole cache blocks by TMA (a box
// of block_size keys × 64 dims each), the partial last block by cp.async; mbarriers pace them
// (full: the copies landed; empty: both warpgroups' MMAs on the stage retired), so the
// warpgroups never meet at a block barrier inside the loop. Rows of 128 bytes (64 dims) in the
// 128-byte swizzle (kernels/wgmma.cuh): Q, K and V tiles are head_dim / 64 slabs each, in the
// one layout that TMA, cp.async and both operand descriptors share.
//
// That kernel (one block per row tile) runs head_dim 256. head_dim 128 runs its persistent,
// warp-specialized form (attention_prefill_persistent_kernel, below): one block per SM walking
// the row tiles, a producer warpgroup loading the next one's Q and first K/V tiles under the
// current one's last tiles and epilogue, and two math warpgroups.
//
// Built for sm_90a only (MOEBATCH_WGMMA, kernels/CMakeLists.txt); without it prefill_on_wgmma
// says false.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/attention_internal.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/phase_clock.cuh"
#include "kernels/rope_device.cuh"
#include "kernels/tensor_map.cuh"
#if MOEBATCH_WGMMA
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

constexpr int kRows = 128;     // rows per block: 64 per warpgroup
constexpr int kThreads = 256;  // two warpgroups

// The tile shape of a head_dim: keys per K/V tile and stages such that the shared memory fits
// 227 KB and the accumulators (S: keys / 2, O: D / 2 fp32 registers a thread) fit beside each
// other. D 128: 128-key tiles, three stages (225 KB); D 256: 64-key tiles, two stages (193 KB).
template <int D>
struct Tiles {
  static constexpr int kKeys = D == 256 ? 64 : 128;
  static constexpr int kStages = D == 256 ? 2 : 3;  // K/V tiles: multiplied, (landing,) being fetched
  static constexpr int kSlabs = D / 64;             // 128-byte rows of 64 dims
  static constexpr int kQSlab = kRows * 128;        // bytes of one slab of the Q tile
  static constexpr int kKvSlab = kKeys * 128;       // of a K or V tile
  static constexpr int kQBytes = kSlabs * kQSlab;
  static constexpr int kTileBytes = kSlabs * kKvSlab;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + 1024;  // + slack to align the base to 1024
  static constexpr int kOutPitch = D + 8;  // epilogue staging row (elements): 16 bytes of padding
  static_assert(kRows * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the stages");
  static_assert(kSmemBytes + 64 <= 227 * 1024, "one block's shared memory");
  static_assert((kThreads / 2) % kKeys == 0, "the loaders split a tile's rows evenly");
};

#if MOEBATCH_WGMMA

constexpr float kLog2e = 1.4426950408889634f;

#if MOEBATCH_PHASE_CLOCKS
// The phase totals of every row block since the last attention_prefill_take_phase_clocks
// (diagnostic builds only: kernels/phase_clock.cuh).
__device__ unsigned long long g_attention_phase_totals[kAttnPhases + 1];
#endif

// The two MMA shapes by N: S = Q·Kᵀ over a tile's keys, O += P·V over head_dim.
template <int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (N == 128)
    wgmma::mma_m64n128k16(d, desc_a, desc_b, accumulate);
  else
    wgmma::mma_m64n64k16(d, desc_a, desc_b, accumulate);
}
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (N == 128)
    wgmma::mma_m64n128k16_rs(d, a, desc_b);
  else
    wgmma::mma_m64n256k16_rs(d, a, desc_b);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ---- the per-tile step that both kernels share ----
// A warpgroup's m64nN accumulators, per thread (lane = 4g + t of warp w of the warpgroup): rows
// a = 16w + g and b = a + 8 of the warpgroup's 64; 8-column chunk j holds columns 8j + 2t + {0, 1},
// s[4j], s[4j + 1] of row a and s[4j + 2], s[4j + 3] of row b. For S the columns are the keys of
// the tile (k0 + 8j + 2t + {0, 1}), for O the head dims. A row's values are spread over the quad
// of lanes sharing g, so its max and sum finish with shuffles over lanes t ^ 1, t ^ 2.

// S = Q·Kᵀ of one key tile: head_dim / 16 k16 steps over the Q and K slabs (128-byte swizzle,
// 32 bytes a step within a slab), committed as one group.
template <int D, int kKeys>
__device__ __forceinline__ void issue_s(float (&s)[kKeys / 2], uint32_t q_wg, int q_slab, uint32_t k_addr,
                                        int kv_slab) {
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t q_k = q_wg + (kk >> 2) * q_slab + (kk & 3) * 32, k_k = k_addr + (kk >> 2) * kv_slab + (kk & 3) * 32;
    mma_ss<kKeys>(s, wgmma::smem_desc_sw128(q_k), wgmma::smem_desc_sw128(k_k), kk > 0);
  }
  wgmma::commit();
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
}

// O += P·V of one key tile: kKeys / 16 k16 steps, P from registers (pf), V N-major (the tile's
// rows as the cache holds them), committed as one group.
template <int D, int kKeys>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pf)[kKeys / 16][4], uint32_t v_addr,
                                         int kv_slab) {
#pragma unroll
  for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    mma_rs<D>(o, pf[kk], wgmma::smem_desc_sw128_mn(v_addr + kk * 16 * 128, kv_slab));
  wgmma::commit();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
}

// Waits for every wgmma group of the warpgroup (S and P·V) and fences both accumulators.
template <int D, int kKeys>
__device__ __forceinline__ void wait_mmas(float (&s)[kKeys / 2], float (&o)[D / 2]) {
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
#pragma unroll
  for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
}

// Causal mask of the tile of keys from k0: -inf where a key reaches its row's bound (lim_a,
// lim_b), only where the tile reaches the bound of the warpgroup's first row (wg_lo).
template <int kKeys>
__device__ __forceinline__ void mask_tile(float (&s)[kKeys / 2], int k0, int t, int wg_lo, int lim_a, int lim_b) {
  if (k0 + kKeys > wg_lo) {
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + 8 * j + 2 * t + e;
        if (key >= lim_a) s[4 * j + e] = -INFINITY;
        if (key >= lim_b) s[4 * j + 2 + e] = -INFINITY;
      }
  }
}

// The online softmax state of a thread's rows a and b: the running max of the base-2 logits
// c·s (c = scale · log2 e) and this lane's partial sum of their exp2 (the quad's sum is taken
// once, in row_inverses).
struct RowSoftmax {
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
};

// One tile of the online softmax: the rows' new max, P = exp2(c·s − max) rounded to bf16 into
// the A fragments of P·V (chunks 2kk, 2kk + 1 are a[0]/a[1], a[2]/a[3] of k16 step kk), the sums
// rescaled and extended. Returns alpha = exp2(old max − new max) of rows a and b (0 on a row's
// first tile), by which O is to be rescaled (rescale_o).
template <int kKeys>
__device__ __forceinline__ float2 online_softmax_tile(const float (&s)[kKeys / 2], uint32_t (&pf)[kKeys / 16][4],
                                                      float log2_scale, RowSoftmax& r) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    mx_a = fmaxf(mx_a, fmaxf(s[4 * j], s[4 * j + 1]));
    mx_b = fmaxf(mx_b, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, x));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, x));
  }
  const float mn_a = fmaxf(r.m_a, mx_a * log2_scale), mn_b = fmaxf(r.m_b, mx_b * log2_scale);
  const float alpha_a = exp2f(r.m_a - mn_a), alpha_b = exp2f(r.m_b - mn_b);  // 0 on the first tile
  r.m_a = mn_a;
  r.m_b = mn_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    const float p0 = exp2f(fmaf(s[4 * j], log2_scale, -mn_a));
    const float p1 = exp2f(fmaf(s[4 * j + 1], log2_scale, -mn_a));
    const float p2 = exp2f(fmaf(s[4 * j + 2], log2_scale, -mn_b));
    const float p3 = exp2f(fmaf(s[4 * j + 3], log2_scale, -mn_b));
    sum_a += p0 + p1;
    sum_b += p2 + p3;
    pf[j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
    pf[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
  }
  r.l_a = r.l_a * alpha_a + sum_a;
  r.l_b = r.l_b * alpha_b + sum_b;
  return make_float2(alpha_a, alpha_b);
}

// O = 0 before a row tile's first P·V (fenced: the accumulators the wgmma will read).
template <int D>
__device__ __forceinline__ void zero_o(float (&o)[D / 2]) {
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    o[i] = 0.f;
    wgmma::fence_operand(o[i]);
  }
}

// O's rows a and b times their alpha (online_softmax_tile).
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], float2 alpha) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j] *= alpha.x;
    o[4 * j + 1] *= alpha.x;
    o[4 * j + 2] *= alpha.y;
    o[4 * j + 3] *= alpha.y;
  }
}

// After the last tile: the rows' sums over the quad and their inverses for the epilogue's one
// rounding of o / l (0 for a row with no keys: a row past n_rows).
__device__ __forceinline__ float2 row_inverses(RowSoftmax& r) {
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    r.l_a += __shfl_xor_sync(kFullMask, r.l_a, x);
    r.l_b += __shfl_xor_sync(kFullMask, r.l_b, x);
  }
  return make_float2(r.l_a > 0.f ? 1.f / r.l_a : 0.f, r.l_b > 0.f ? 1.f / r.l_b : 0.f);
}

// Grid: (kv head, row tile, sequence), row tiles heaviest (most keys) first. Every row's
// exclusive key bound lim(row) = kv_len − n_q + token + 1 ≥ 1 is nondecreasing in the row, so
// key 0 is valid for every row and a warpgroup's first tile leaves each row max finite. Rows past
// the sequence take the last row's bound and zero q, and are not stored. A warpgroup stops
// multiplying after the last tile its own rows reach (wg_tiles) but keeps releasing the stages.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_wgmma_kernel(AttentionParams p, const __grid_constant__ CUtensorMap k_map,
                                   const __grid_constant__ CUtensorMap v_map) {
  using T = Tiles<D>;
  constexpr int kKeys = T::kKeys, kStages = T::kStages, kSlabs = T::kSlabs, kQSlab = T::kQSlab;
  constexpr int kKvSlab = T::kKvSlab, kQBytes = T::kQBytes, kTileBytes = T::kTileBytes;
  constexpr int kStageBytes = T::kStageBytes, kOutPitch = T::kOutPitch;
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[0..kStages), empty[0..kStages)
  pdl_sync();
  PhaseClock<kAttnPhases> clock;
  const int kvh = blockIdx.x, seq = blockIdx.z;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int q0 = p.q_start[seq];
  const int n_q = p.q_start[seq + 1] - q0;
  const int group = p.n_q_heads / p.n_kv_heads;
  const int n_rows = n_q * group;
  if (row0 >= n_rows) return;
  const int pos0 = p.kv_lens[seq] - n_q;  // position of the sequence's first query token
  const auto limit = [&](int row) { return pos0 + min(row, n_rows - 1) / group + 1; };
  const int block_limit = limit(row0 + kRows - 1);
  const int n_tiles = CEIL_DIV(block_limit, kKeys);

  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t stage_addr0 = q_addr + kQBytes;
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  // The second warpgroup brings the K/V tiles (it runs behind the first, so its wait for a free
  // stage is short). full[s]: its threads' cp.async arrivals plus its lane 0's TMA byte count;
  // empty[s]: every thread.
  const int wg = threadIdx.x >> 7;
  const bool loader = wg == 1;
  wgmma::init_ring_barriers(full0, empty0, kStages, kThreads / 2 + 1, kThreads);
  clock.mark(kAttnBounds);

  // Row copies by cp.async, chunks first, first + kStep, ... of row `row` (16-byte chunk c of a
  // row lies in slab c / 8); ok false: zeros. With kStep 2 a thread pair covers a 32-byte sector
  // per instruction.
  const auto copy_row = [&](auto step, uint8_t* tile, int slab_bytes, int row, int first, const bf16* src, bool ok) {
    constexpr int kStep = decltype(step)::value;
#pragma unroll
    for (int i = 0; i < kChunks / kStep; ++i) {
      const int c = kStep * i + first;
      cp_async16(tile + (c >> 3) * slab_bytes + wgmma::sw128_offset(row, c & 7), ok ? src + 8 * c : src, ok ? 16 : 0);
    }
  };
  {  // Q: thread pair (2r, 2r + 1) moves row r; rows past the sequence are zero
    const int r = threadIdx.x >> 1, row = row0 + r;
    const bool ok = row < n_rows;
    copy_row(std::integral_constant<int, 2>{}, smem, kQSlab, r, threadIdx.x & 1,
             ok ? p.q + static_cast<size_t>(q0 + row / group) * p.q_stride + (kvh * group + row % group) * D : p.q, ok);
    cp_async_commit();
  }
  // K/V tile kt into stage kt % kStages. The cache blocks wholly below block_limit come by TMA
  // (lane b of the loaders' first warp brings block b of the tile: a box of block_size rows × 64
  // dims per slab, for K and for V; lane 0 first announces their bytes). Keys from full_end on —
  // the partial last block, and the tile's rest, zero-filled: their p is 0, but stale shared
  // memory or unused cache slots may hold NaN, and 0·NaN = NaN — by the loaders' cp.async,
  // kThreads / 2 / kKeys threads a row.
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  const int full_end = block_limit / p.block_size * p.block_size;
  constexpr int kRowThreads = kThreads / 2 / kKeys;  // loader threads per row of a tile
  const int lt = threadIdx.x & 127;  // the loader thread, its lane in the first warp
  const auto load_tile = [&](int kt) {
    const int stage = kt % kStages, k0 = kt * kKeys;
    const uint32_t full = full0 + stage * 8;
    const uint32_t k_addr = stage_addr0 + stage * kStageBytes, v_addr = k_addr + kTileBytes;
    if (lt < 32) {
      const int whole = min(max(full_end - k0, 0), kKeys) / p.block_size;
      if (lt == 0) wgmma::mbarrier_arrive_expect_tx(full, whole * p.block_size * 128 * kSlabs * 2);
      __syncwarp();
      if (lt < whole) {
        const int slot0 = __ldg(table + k0 / p.block_size + lt) * p.block_size;
        const uint32_t off = lt * p.block_size * 128;
#pragma unroll
        for (int slab = 0; slab < kSlabs; ++slab) {
          wgmma::tma_load_3d(k_addr + slab * kKvSlab + off, &k_map, 64 * slab, kvh, slot0, full);
          wgmma::tma_load_3d(v_addr + slab * kKvSlab + off, &v_map, 64 * slab, kvh, slot0, full);
        }
      }
    }
    const int kpos = k0 + lt / kRowThreads;
    if (kpos >= full_end) {
      const bool ok = kpos < block_limit;
      const int slot = ok ? __ldg(table + kpos / p.block_size) * p.block_size + kpos % p.block_size : 0;
      // size_t: slot * n_kv_heads * head_dim overflows int for large pools.
      const size_t off = (static_cast<size_t>(slot) * p.n_kv_heads + kvh) * D;
      uint8_t* k_tile = smem + kQBytes + stage * kStageBytes;
      const std::integral_constant<int, kRowThreads> step;
      copy_row(step, k_tile, kKvSlab, lt / kRowThreads, lt % kRowThreads, p.k_cache + off, ok);
      copy_row(step, k_tile + kTileBytes, kKvSlab, lt / kRowThreads, lt % kRowThreads, p.v_cache + off, ok);
    }
    wgmma::cp_async_mbarrier_arrive(full);
  };
  if (loader)
    for (int kt = 0; kt < kStages - 1 && kt < n_tiles; ++kt) load_tile(kt);
  cp_async_wait<0>();  // this thread's Q copies (the one committed group; the tiles are paced by mbarriers)
  // cp.async wrote through the generic proxy, the tensor cores read through the async one:
  // fenced by each writer before the barrier and by each reader after it.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  clock.mark(kAttnQ);

  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow0 = row0 + 64 * wg;
  const int wg_lo = limit(wrow0), wg_hi = limit(wrow0 + 63);
  const int wg_tiles = wrow0 < n_rows ? CEIL_DIV(wg_hi, kKeys) : 0;
  const int row_a = wrow0 + 16 * ((threadIdx.x >> 5) & 3) + g;  // this thread's rows: row_a, row_a + 8
  const int lim_a = limit(row_a), lim_b = limit(row_a + 8);
  const uint32_t q_wg = q_addr + wg * 64 * 128;  // this warpgroup's rows of slab 0
  const float log2_scale = p.scale * kLog2e;      // scores to base-2 logits, applied in fp32

  float s[kKeys / 2], o[D / 2];
  uint32_t pf[kKeys / 16][4];  // P as the A operand of the k16 steps of P·V
  zero_o<D>(o);
  RowSoftmax rows;

  const auto wait_tile = [&](int kt) {
    wgmma::mbarrier_wait(full0 + (kt % kStages) * 8, (kt / kStages) & 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };

  if (wg_tiles > 0) {
    wait_tile(0);
    issue_s<D, kKeys>(s, q_wg, kQSlab, stage_addr0, kKvSlab);
  }
  clock.mark(kAttnFirstTile);
  for (int kt = 0; kt < n_tiles; ++kt) {
    wait_mmas<D, kKeys>(s, o);  // S(kt) and P·V(kt − 1)
    clock.mark(kAttnMmaWait);
    // Tile kt − 1's stage is free once both warpgroups got here: refill it with tile
    // kt + kStages − 1.
    if (kt > 0) wgmma::mbarrier_arrive(empty0 + ((kt - 1) % kStages) * 8);
    if (loader && kt + kStages - 1 < n_tiles) {
      const int next = kt + kStages - 1;
      if (next >= kStages) wgmma::mbarrier_wait(empty0 + (next % kStages) * 8, (next / kStages - 1) & 1);
      load_tile(next);
    }
    clock.mark(kAttnRefill);
    const bool active = kt < wg_tiles, more = kt + 1 < wg_tiles;
    if (active) {
      mask_tile<kKeys>(s, kt * kKeys, t, wg_lo, lim_a, lim_b);
      rescale_o<D>(o, online_softmax_tile<kKeys>(s, pf, log2_scale, rows));
    }
    clock.mark(kAttnSoftmax);
    if (more) wait_tile(kt + 1);
    clock.mark(kAttnFullWait);
    if (active) issue_pv<D, kKeys>(o, pf, stage_addr0 + (kt % kStages) * kStageBytes + kTileBytes, kKvSlab);
    if (more) issue_s<D, kKeys>(s, q_wg, kQSlab, stage_addr0 + ((kt + 1) % kStages) * kStageBytes, kKvSlab);
    clock.mark(kAttnIssue);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
  cp_async_commit();
  cp_async_wait<0>();  // (every tile's copies were waited for by the warpgroup holding the last row)
  __syncthreads();  // both warpgroups are done with the stages: they hold the output tile now

  // One rounding: o / l to bf16, staged for 16-byte row stores.
  const float2 inv = row_inverses(rows);
  const float inv_a = inv.x, inv_b = inv.y;
  bf16* const o_s = reinterpret_cast<bf16*>(smem + kQBytes);
  const int r = row_a - row0;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<__nv_bfloat162*>(o_s + r * kOutPitch + 8 * j + 2 * t) =
        __floats2bfloat162_rn(o[4 * j] * inv_a, o[4 * j + 1] * inv_a);
    *reinterpret_cast<__nv_bfloat162*>(o_s + (r + 8) * kOutPitch + 8 * j + 2 * t) =
        __floats2bfloat162_rn(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kThreads * i, rr = idx / kChunks, ch = idx % kChunks * 8;
    const int row = row0 + rr;
    if (row >= n_rows) continue;
    const size_t out_row = static_cast<size_t>(q0 + row / group) * p.n_q_heads + kvh * group + row % group;
    *reinterpret_cast<uint4*>(p.out + out_row * D + ch) = *reinterpret_cast<const uint4*>(o_s + rr * kOutPitch + ch);
  }
  clock.mark(kAttnEpilogue);
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_attention_phase_totals);
#endif
}

#endif  // MOEBATCH_WGMMA

// ---- head_dim 128: persistent and warp-specialized ----------------------------------------
// The kernel above spends about a third of a row block in its prologue (bounds, Q, the first
// K/V tile: dependent round trips) and epilogue, with nothing to overlap them: its block holds
// the SM alone. Here one block per SM walks the work items (sequence, row tile, kv head) —
// heaviest row tiles first across all sequences, block b taking items b, b + G, … — with a
// producer warpgroup (0) that only loads and two math warpgroups (1, 2: 64 rows each) that only
// multiply: the producer brings the next item's Q and first K/V tiles while the math warpgroups
// finish this item's tiles and epilogue.
//
// Shared memory: two Q buffers (one item multiplied, the next landing), and K and V each in a
// ring of two 32 KB stages with barriers of their own. A combined K+V ring of two stages would
// free tile t's stage only once P·V(t) retired, at the start of iteration t + 1, while tile
// t + 2's K is needed at that iteration's end: the load would have a softmax to land in. K(t)
// is dead once S(t) retired (iteration t's start) and V(t) once P·V(t) did, so the separate
// rings refill K(t + 2) from iteration t on and V(t + 1) from iteration t on, each needed at
// the end of iteration t + 1 — the lead of the three combined stages of the kernel above, in
// the shared memory of two (192 KB with the two Q buffers).
//
// Barriers (counters run across the block's items; a waiter is never two phases behind: every
// thread that waits a barrier's phase p has waited its phase p − 1 or the phase cannot start):
//   q_full[b]   128 producer threads' cp.async arrivals (noinc): item's Q landed in buffer b;
//   q_empty[b]  256 math threads, after each one's epilogue reads of buffer b (the O staging);
//   k_full[s], v_full[s]  128 cp.async arrivals + producer thread 0's TMA byte count;
//   k_empty[s], v_empty[s]  256 math threads: K(t) after S(t) retired, V(t) after P·V(t).
// Every math thread waits k_full and v_full for every tile of an item, also a tile its rows do
// not reach (wg_tiles) and in a warpgroup with no rows at all, before arriving on the empties:
// an arrival never lands in a phase before its own, and every TMA the producer issued has been
// waited for by someone before the block exits. The producer and the math warpgroups each
// compute the walk and an item's bounds themselves (the same loads, deterministic): no ring of
// identities to pass and no barrier between them beyond the data's own.
constexpr int kPersistThreads = 384;  // producer warpgroup + two math warpgroups
// 65,536 / 384 = 170 → 168 registers a thread at launch; the producer gives back down to 56 so
// that the math warpgroups can hold 224 (S 64 + O 64 + P 32 + softmax state and addressing;
// ptxas spills them at 216). setmaxnreg.inc only takes what .dec released: the block's 3 × 168,
// not the register file's 65,536 (64 / 224 would leave the math warpgroups waiting forever).
constexpr int kProducerRegs = 56, kMathRegs = 224;
static_assert(kProducerRegs + 2 * kMathRegs <= 3 * (65536 / kPersistThreads / 8 * 8), "setmaxnreg budget");
struct Persist {
  static constexpr int kKeys = 128, kSlabs = 2;
  static constexpr int kQSlab = kRows * 128;  // 16 KB: one 64-dim slab of the 128-row Q tile
  static constexpr int kQBytes = kSlabs * kQSlab;
  static constexpr int kKvSlab = kKeys * 128;
  static constexpr int kTileBytes = kSlabs * kKvSlab;  // a K or a V tile: 32 KB
  static constexpr int kStages = 2;
  static constexpr int kKBase = 2 * kQBytes;                        // Q0 Q1 | K0 K1 | V0 V1
  static constexpr int kVBase = kKBase + kStages * kTileBytes;
  static constexpr int kSmemBytes = kVBase + kStages * kTileBytes + 1024;  // + slack to align to 1024
  static_assert(kSmemBytes + 128 <= 227 * 1024, "one block's shared memory (and the static barriers)");
  static_assert(kRows * kKeys * 2 / 16 == 16 * 128, "a Q tile is 16 chunks a row, two rows a thread pair");
};

#if MOEBATCH_WGMMA

// One work item of the persistent walk: item i is kv head i % H, sequence (i / H) % S, row tile
// R − 1 − i / (H·S) (R: row tiles of the longest sequence), so that the walk starts with the
// heaviest row tiles of every sequence. false: the row tile lies past the sequence's rows (both
// sides skip it).
struct AttnItem {
  int seq, kvh, row0, q0, n_rows, pos0, block_limit, n_tiles;
};
__device__ __forceinline__ bool attn_item(const AttentionParams& p, int i, int row_tiles, int group, AttnItem& it) {
  it.kvh = i % p.n_kv_heads;
  it.seq = i / p.n_kv_heads % p.num_seqs;
  it.row0 = (row_tiles - 1 - i / (p.n_kv_heads * p.num_seqs)) * kRows;
  it.q0 = __ldg(p.q_start + it.seq);
  const int n_q = __ldg(p.q_start + it.seq + 1) - it.q0;
  it.n_rows = n_q * group;
  if (it.row0 >= it.n_rows) return false;
  it.pos0 = __ldg(p.kv_lens + it.seq) - n_q;
  it.block_limit = it.pos0 + min(it.row0 + kRows - 1, it.n_rows - 1) / group + 1;
  // ≥ 1 where kv_len ≥ the query tokens, as the contract says; never negative (a hang) otherwise
  it.n_tiles = max(CEIL_DIV(it.block_limit, Persist::kKeys), 0);
  return true;
}

// Chunks first, first + kStep, … of a 256-byte row into row `row` of a two-slab swizzled tile
// by cp.async (ok false: zeros). Unrolled by 4 only: fully unrolled, ptxas hoists the 16 chunks'
// swizzled offsets out of the producer's tile loop and spills at its 56 registers.
template <int kStep>
__device__ __forceinline__ void copy_row_d128(uint8_t* tile, int slab_bytes, int row, int first, const bf16* src,
                                              bool ok) {
#pragma unroll 4
  for (int i = 0; i < 16 / kStep; ++i) {
    const int c = kStep * i + first;
    cp_async16(tile + (c >> 3) * slab_bytes + wgmma::sw128_offset(row, c & 7), ok ? src + 8 * c : src, ok ? 16 : 0);
  }
}

// AttentionParams::rope_q on the math warpgroups: at an item's start, before its Q has landed,
// the thread pair (2r, 2r + 1) of a warpgroup fetches the rotation row of its row's token
// (rope_q_fetch); once Q is in, it normalises and rotates the row in place (rope_q_apply) — the
// arithmetic of qk_norm_rope's wide form (kernels/rope_device.cuh), the same bits — and the
// warpgroup meets before its S MMAs read the rows. Each thread takes the 16-byte chunks first,
// first + 2, … of the row's 16: chunk c's dims rotate with chunk c + 8's, the same chunk of the
// second slab, so a thread holds both halves of every pair it rotates, and the pair's sums of
// squares meet by one shuffle. The warpgroups wait for Q here anyway (the producer loads it an
// item ahead), and their registers are free between items: in the producer (56 registers, its
// dependent loads in line with the K/V ring's) the same work cost the attention 24–46%.
// (2026-12-07, bench/RESULTS.md.)
struct RopeQCs {
  float4 v[16];  // chunk pair i's (cos, sin) of its 8 dims in v[4i .. 4i + 3], two pairs a float4
};
__device__ __forceinline__ void rope_q_fetch(const QkNormRopeParams& rp, int token, int first, bool ok, RopeQCs& cs) {
  const float4* row = reinterpret_cast<const float4*>(rp.rotation + static_cast<size_t>(ok ? token : 0) * 64);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) cs.v[4 * i + j] = __ldg(row + 4 * (first + 2 * i) + j);
}

__device__ __forceinline__ void rope_q_apply(uint8_t* tile, int slab_bytes, int r, int first, const RopeQCs& cs,
                                             const QkNormRopeParams& rp, bool ok) {
  const bool norm = rp.q_norm != nullptr;
  // chunk pair i: chunks first + 2i of the two slabs
  const auto lo = [&](int i) { return reinterpret_cast<uint4*>(tile + wgmma::sw128_offset(r, first + 2 * i)); };
  const auto hi = [&](int i) { return reinterpret_cast<uint4*>(tile + slab_bytes + wgmma::sw128_offset(r, first + 2 * i)); };
  float rstd = 1.f;
  if (norm) {
    // the butterfly of the wide form: chunks c and c + 8, then c and c ^ 4, c ^ 2 here, c ^ 1 in
    // the partner thread
    float part[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float x[8], y[8];
      load8(reinterpret_cast<const bf16*>(lo(i)), x);
      load8(reinterpret_cast<const bf16*>(hi(i)), y);
      part[i] = rope_sum_squares8(x) + rope_sum_squares8(y);
    }
    float ss = (part[0] + part[2]) + (part[1] + part[3]);
    ss += __shfl_xor_sync(kFullMask, ss, 1);
    rstd = rope_rstd(ss, 128, rp.eps);
  }
  if (!ok) return;  // a row past the item's: zeros, never stored
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = first + 2 * i;  // dims [8c, 8c + 8) and their partners 64 on
    float x[8], y[8];
    load8(reinterpret_cast<const bf16*>(lo(i)), x);
    load8(reinterpret_cast<const bf16*>(hi(i)), y);
    if (norm) {
      float wx[8], wy[8];
      load8(rp.q_norm + 8 * c, wx);
      load8(rp.q_norm + 64 + 8 * c, wy);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[e] = rope_normed(x[e], rstd, rp.norm_offset, wx[e]);
        y[e] = rope_normed(y[e], rstd, rp.norm_offset, wy[e]);
      }
    }
    float xo[8], yo[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float4 q = cs.v[4 * i + e / 2];
      const float2 cse = e % 2 == 0 ? make_float2(q.x, q.y) : make_float2(q.z, q.w);
      xo[e] = rope_rotated(x[e], y[e], cse, -1.f);
      yo[e] = rope_rotated(y[e], x[e], cse, 1.f);
    }
    store8(reinterpret_cast<bf16*>(lo(i)), xo);
    store8(reinterpret_cast<bf16*>(hi(i)), yo);
  }
}

template <bool kRopeQ>
__global__ void __launch_bounds__(kPersistThreads, 1)
    attention_prefill_persistent_kernel(AttentionParams p, int row_tiles, const __grid_constant__ CUtensorMap k_map,
                                        const __grid_constant__ CUtensorMap v_map) {
  using T = Persist;
  constexpr int D = 128, kKeys = T::kKeys, kQSlab = T::kQSlab, kKvSlab = T::kKvSlab, kQBytes = T::kQBytes;
  constexpr int kTileBytes = T::kTileBytes;
  extern __shared__ uint8_t smem_raw[];
  // q_full[2], q_empty[2], k_full[2], k_empty[2], v_full[2], v_empty[2]
  __shared__ __align__(8) uint64_t bars[12];
  pdl_sync();
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t q_full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t q_empty0 = q_full0 + 16, k_full0 = q_full0 + 32, k_empty0 = q_full0 + 48;
  const uint32_t v_full0 = q_full0 + 64, v_empty0 = q_full0 + 80;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      wgmma::mbarrier_init(q_full0 + 8 * b, 128);
      wgmma::mbarrier_init(q_empty0 + 8 * b, 256);
      wgmma::mbarrier_init(k_full0 + 8 * b, 128 + 1);
      wgmma::mbarrier_init(k_empty0 + 8 * b, 256);
      wgmma::mbarrier_init(v_full0 + 8 * b, 128 + 1);
      wgmma::mbarrier_init(v_empty0 + 8 * b, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();
  const int group = p.n_q_heads / p.n_kv_heads;
  const int n_items = p.n_kv_heads * p.num_seqs * row_tiles;
  const int wg = threadIdx.x >> 7;
  const int lt = threadIdx.x & 127;  // the thread within its warpgroup

  if (wg == 0) {
    // ---- the producer: per item Q into buffer qi % 2, then the item's K/V tiles ----
    wgmma::setmaxnreg_dec<kProducerRegs>();
    int qi = 0, g = 0;  // the block's items (not skipped) and K/V tiles so far, as the math's
    for (int i = blockIdx.x; i < n_items; i += gridDim.x) {
      AttnItem it;
      if (!attn_item(p, i, row_tiles, group, it)) continue;
      const int qb = qi & 1;
      if (qi >= 2) wgmma::mbarrier_wait(q_empty0 + 8 * qb, ((qi >> 1) - 1) & 1);
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {  // thread pair (2r, 2r + 1) moves row r (+ 64); past the rows: zeros
        const int r = (lt >> 1) + 64 * pass, row = it.row0 + r;
        const bool ok = row < it.n_rows;
        const bf16* src =
            ok ? p.q + static_cast<size_t>(it.q0 + row / group) * p.q_stride + (it.kvh * group + row % group) * D : p.q;
        copy_row_d128<2>(smem + qb * kQBytes, kQSlab, r, lt & 1, src, ok);
      }
      wgmma::cp_async_mbarrier_arrive(q_full0 + 8 * qb);

      // K and V of tile kt (block tile g) into stage g % 2 of their rings, as the kernel above:
      // the cache blocks wholly below block_limit by TMA (lane b of warp 0 block b of the tile;
      // lane 0 announces the bytes), keys from full_end on — the partial last block, then zeros —
      // by cp.async, one thread a key.
      const int32_t* table = p.block_tables + static_cast<size_t>(it.seq) * p.max_blocks_per_seq;
      const int full_end = it.block_limit / p.block_size * p.block_size;
      for (int kt = 0; kt < it.n_tiles; ++kt, ++g) {
        const int stage = g & 1, k0 = kt * kKeys, kpos = k0 + lt;
        const int whole = min(max(full_end - k0, 0), kKeys) / p.block_size;  // ≤ 32 (prefill_on_wgmma)
        const int slot0 = lt < whole ? __ldg(table + k0 / p.block_size + lt) * p.block_size : 0;
        const bool partial = kpos >= full_end, ok = kpos < it.block_limit;
        const int slot = partial && ok ? __ldg(table + kpos / p.block_size) * p.block_size + kpos % p.block_size : 0;
        // size_t: slot * n_kv_heads * head_dim overflows int for large pools.
        const size_t off = (static_cast<size_t>(slot) * p.n_kv_heads + it.kvh) * D;
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // K, then V
          const uint32_t full = (half ? v_full0 : k_full0) + 8 * stage;
          if (g >= 2) wgmma::mbarrier_wait((half ? v_empty0 : k_empty0) + 8 * stage, ((g >> 1) - 1) & 1);
          const int base = (half ? T::kVBase : T::kKBase) + stage * kTileBytes;
          if (lt < 32) {
            if (lt == 0) wgmma::mbarrier_arrive_expect_tx(full, whole * p.block_size * 128 * T::kSlabs);
            __syncwarp();
            if (lt < whole) {
#pragma unroll
              for (int slab = 0; slab < T::kSlabs; ++slab)
                wgmma::tma_load_3d(smem_addr + base + slab * kKvSlab + lt * p.block_size * 128, half ? &v_map : &k_map,
                                   64 * slab, it.kvh, slot0, full);
            }
          }
          if (partial) copy_row_d128<1>(smem + base, kKvSlab, lt, 0, (half ? p.v_cache : p.k_cache) + off, ok);
          wgmma::cp_async_mbarrier_arrive(full);
        }
      }
      ++qi;
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy of this thread in flight (the TMA loads: the math waits for each)
    return;
  }

  // ---- the math warpgroups: 64 rows each of every item ----
  wgmma::setmaxnreg_inc<kMathRegs>();
  PhaseClock<kAttnPhases> clock;
  const int mw = wg - 1;  // rows [64·mw, 64·mw + 64) of a row tile
  const int lane = threadIdx.x & 31, g8 = lane >> 2, t = lane & 3;
  const int r_a = 64 * mw + 16 * ((threadIdx.x >> 5) & 3) + g8;  // this thread's tile rows: r_a, r_a + 8
  const float log2_scale = p.scale * kLog2e;

  float s[kKeys / 2], o[D / 2];
  uint32_t pf[kKeys / 16][4];
  int qi = 0, g = 0;
  unsigned items = 0;
  for (int i = blockIdx.x; i < n_items; i += gridDim.x) {
    AttnItem it;
    if (!attn_item(p, i, row_tiles, group, it)) continue;
    const int qb = qi & 1;
    const auto limit = [&](int row) { return it.pos0 + min(row, it.n_rows - 1) / group + 1; };
    const int wrow0 = it.row0 + 64 * mw;
    const int wg_lo = limit(wrow0), wg_hi = limit(wrow0 + 63);
    const int wg_tiles = wrow0 < it.n_rows ? CEIL_DIV(wg_hi, kKeys) : 0;  // ≤ it.n_tiles
    const int lim_a = limit(it.row0 + r_a), lim_b = limit(it.row0 + r_a + 8);
    const uint32_t q_wg = smem_addr + qb * kQBytes + mw * 64 * 128;  // this warpgroup's rows of slab 0
    // rope_q: this thread's half of row rq of the tile (its pair's), fetched before Q lands
    const int rq = 64 * mw + (lt >> 1), row_q = it.row0 + rq;
    RopeQCs cs;
    if constexpr (kRopeQ) rope_q_fetch(p.rope, it.q0 + row_q / group, lt & 1, row_q < it.n_rows, cs);
    clock.mark(kAttnBounds);
    wgmma::mbarrier_wait(q_full0 + 8 * qb, (qi >> 1) & 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // Q came by cp.async (generic proxy)
    if constexpr (kRopeQ) {
      rope_q_apply(smem + qb * kQBytes, kQSlab, rq, lt & 1, cs, p.rope, row_q < it.n_rows);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // written by this thread, read by the MMAs
      // the warpgroup's 64 rows all rotated before its S MMAs read them (0 is __syncthreads')
      if (mw == 0)
        named_barrier_sync<1, 128>();
      else
        named_barrier_sync<2, 128>();
    }
    clock.mark(kAttnQ);

    zero_o<D>(o);
    RowSoftmax rows;

    const auto wait_k = [&](int gt) {
      wgmma::mbarrier_wait(k_full0 + 8 * (gt & 1), (gt >> 1) & 1);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    };
    const auto wait_v = [&](int gt) {
      wgmma::mbarrier_wait(v_full0 + 8 * (gt & 1), (gt >> 1) & 1);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    };
    const auto k_tile = [&](int gt) { return smem_addr + T::kKBase + (gt & 1) * kTileBytes; };

    if (wg_tiles > 0) {
      wait_k(g);
      issue_s<D, kKeys>(s, q_wg, kQSlab, k_tile(g), kKvSlab);
    }
    clock.mark(kAttnFirstTile);
    for (int kt = 0; kt < it.n_tiles; ++kt) {
      const int gt = g + kt;
      wait_mmas<D, kKeys>(s, o);  // S(kt) and P·V(kt − 1)
      clock.mark(kAttnMmaWait);
      const bool active = kt < wg_tiles, more = kt + 1 < wg_tiles;
      // K(kt) is dead (S(kt) retired, or never issued: a tile past this warpgroup's rows, whose
      // K is still waited for, so that the release lands in its own phase), V(kt − 1) too.
      if (!active) wait_k(gt);
      wgmma::mbarrier_arrive(k_empty0 + 8 * (gt & 1));
      if (kt > 0) wgmma::mbarrier_arrive(v_empty0 + 8 * ((gt - 1) & 1));
      clock.mark(kAttnRefill);
      if (active) {
        mask_tile<kKeys>(s, kt * kKeys, t, wg_lo, lim_a, lim_b);
        rescale_o<D>(o, online_softmax_tile<kKeys>(s, pf, log2_scale, rows));
      }
      clock.mark(kAttnSoftmax);
      if (more) wait_k(gt + 1);
      wait_v(gt);  // also where this warpgroup does not multiply it: its release is next
      clock.mark(kAttnFullWait);
      if (active) issue_pv<D, kKeys>(o, pf, smem_addr + T::kVBase + (gt & 1) * kTileBytes, kKvSlab);
      if (more) issue_s<D, kKeys>(s, q_wg, kQSlab, k_tile(gt + 1), kKvSlab);
      clock.mark(kAttnIssue);
    }
    wgmma::wait<0>();
#pragma unroll
    for (int k = 0; k < D / 2; ++k) wgmma::fence_operand(o[k]);
    g += it.n_tiles;
    if (it.n_tiles > 0) wgmma::mbarrier_arrive(v_empty0 + 8 * ((g - 1) & 1));  // the item's last V

    // Epilogue: o / l rounded once to bf16, staged in this warpgroup's own 64 rows of the Q
    // buffer (its S reads of them all retired; the other warpgroup reads only its own rows) in
    // the same swizzled layout — conflict-free bf16x2 writes, one 128-byte row per quarter warp
    // on the way out — then 16-byte stores of whole rows.
    const float2 inv = row_inverses(rows);
    const float inv_a = inv.x, inv_b = inv.y;
    uint8_t* const q_buf = smem + qb * kQBytes;
    // The buffer was last read by the tensor cores (async proxy); now written by this thread.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int slab = (j >> 3) * kQSlab;
      *reinterpret_cast<__nv_bfloat162*>(q_buf + slab + wgmma::sw128_offset(r_a, j & 7) + 4 * t) =
          __floats2bfloat162_rn(o[4 * j] * inv_a, o[4 * j + 1] * inv_a);
      *reinterpret_cast<__nv_bfloat162*>(q_buf + slab + wgmma::sw128_offset(r_a + 8, j & 7) + 4 * t) =
          __floats2bfloat162_rn(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
    }
    // this warpgroup's 128 threads only (0 is __syncthreads')
    if (mw == 0)
      named_barrier_sync<1, 128>();
    else
      named_barrier_sync<2, 128>();
#pragma unroll
    for (int k = 0; k < 64 * 16 / 128; ++k) {  // 64 rows × 16 chunks of 16 bytes, 8 a thread
      const int idx = lt + 128 * k, rr = 64 * mw + (idx >> 4), ch = idx & 15;
      const int row = it.row0 + rr;
      if (row >= it.n_rows) continue;
      const size_t out_row = static_cast<size_t>(it.q0 + row / group) * p.n_q_heads + it.kvh * group + row % group;
      *reinterpret_cast<uint4*>(p.out + out_row * D + ch * 8) =
          *reinterpret_cast<const uint4*>(q_buf + (ch >> 3) * kQSlab + wgmma::sw128_offset(rr, ch & 7));
    }
    // This thread's reads of the staging are done: the producer may refill the buffer.
    wgmma::mbarrier_arrive(q_empty0 + 8 * qb);
    ++qi;
    ++items;
    clock.mark(kAttnEpilogue);
  }
#if MOEBATCH_PHASE_CLOCKS
  clock.flush(g_attention_phase_totals, items);
#else
  (void)items;
#endif
}

#endif  // MOEBATCH_WGMMA

}  // namespace

// Where prefill takes this kernel. head_dim 128: a block has its SM to itself (225 KB of shared
// memory, 252 registers a thread), so its prologue (Q and the first K/V tiles) and epilogue
// overlap nothing; with one key tile per block (no context longer than 128 keys) that costs more
// than the faster MMAs save — 64 prompts of 128 tokens 127.8 µs against mma.sync's 110.3,
// 8 × 512 101.2 against 129.9 (bench/RESULTS.md, 2026-12-03) — so such steps stay on mma.sync.
// (Measured on the kernel of a block per row tile; the persistent form that now takes head_dim
// 128 overlaps both, which may move this bound.)
// head_dim 256: the alternative is the CUDA-core kernel, so every prefill.
bool prefill_on_wgmma(const AttentionParams& p) {
  if (p.prefill_kernel == AttentionPrefillKernel::mma_sync) return false;
  int keys = 0;  // per K/V tile
  if (p.head_dim == 128 && p.max_kv_len > Tiles<128>::kKeys)
    keys = Tiles<128>::kKeys;
  else if (p.head_dim == 256)
    keys = Tiles<256>::kKeys;
  // A tile's cache blocks go to the lanes of the loaders' first warp, one each.
  if (keys == 0 || p.block_size < keys / 32 || keys % p.block_size != 0) return false;
  // The sm_90a code and a device that runs it: the same condition as every wgmma kernel's.
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return moe_wgmma_available(device);
}

bool wgmma_rotates_q(const AttentionParams& p) {
  const QkNormRopeParams& r = p.rope;
  return p.head_dim == 128 && rope_rotated_dims(r.rotary_dim, r.head_dim) == 128 && r.rotation != nullptr &&
         aligned16(r.rotation) && (r.q_norm == nullptr || aligned16(r.q_norm));
}

#if MOEBATCH_WGMMA
namespace {

template <int D>
void launch(const AttentionParams& p, cudaStream_t stream) {
  const int group = p.n_q_heads / p.n_kv_heads;
  const int64_t row_tiles = CEIL_DIV(static_cast<int64_t>(p.max_q_len) * group, kRows);
  MB_CHECK(row_tiles <= 65535, "attention: too many query rows for one launch");
  // The cache as [slots, kv heads, head_dim] for TMA. Its slot count is not passed: the extent is
  // TMA's coordinate range, and the block table is trusted for which slots are read, as by every
  // attention kernel.
  constexpr int64_t kSlotExtent = (int64_t{1} << 31) - 1;
  const CUtensorMap k_map = tensor_map_3d_bf16(p.k_cache, kSlotExtent, p.n_kv_heads, D, p.block_size);
  const CUtensorMap v_map = tensor_map_3d_bf16(p.v_cache, kSlotExtent, p.n_kv_heads, D, p.block_size);
  if constexpr (D == 128) {
    // Persistent: one block per SM (AttentionParams::max_blocks caps it for tests) walking the
    // (sequence, row tile, kv head) items, those past a sequence's rows included (skipped).
    const int64_t items = row_tiles * p.n_kv_heads * p.num_seqs;
    MB_CHECK(items < (int64_t{1} << 31) - (int64_t{1} << 20), "attention: too many row tiles for one launch");
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int blocks = static_cast<int>(std::min<int64_t>(p.max_blocks > 0 ? std::min(sms, p.max_blocks) : sms, items));
    const auto kernel = p.rope_q ? attention_prefill_persistent_kernel<true> : attention_prefill_persistent_kernel<false>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Persist::kSmemBytes));
    launch_dependent(kernel, dim3(blocks), kPersistThreads, Persist::kSmemBytes, stream, p,
                     static_cast<int>(row_tiles), k_map, v_map);
  } else {
    // Above the 48 KB default; set per launch, as attributes are per device.
    const auto kernel = attention_prefill_wgmma_kernel<D>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles<D>::kSmemBytes));
    launch_dependent(kernel, dim3(p.n_kv_heads, static_cast<unsigned>(row_tiles), p.num_seqs), kThreads,
                     Tiles<D>::kSmemBytes, stream, p, k_map, v_map);
  }
  CUDA_CHECK_LAST();
}

}  // namespace
#endif

std::vector<uint64_t> attention_prefill_take_phase_clocks() {
#if MOEBATCH_WGMMA && MOEBATCH_PHASE_CLOCKS
  return take_phase_totals(g_attention_phase_totals);
#else
  return {};
#endif
}

void attention_prefill_wgmma(const AttentionParams& p, cudaStream_t stream) {
#if MOEBATCH_WGMMA
  if (p.head_dim == 256)
    launch<256>(p, stream);
  else
    launch<128>(p, stream);
#else
  (void)p;
  (void)stream;
  MB_CHECK(false, "attention: this build has no sm_90a code (see prefill_on_wgmma)");
#endif
}

}  // namespace moebatch::kernels
