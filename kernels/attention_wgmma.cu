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
// Built for sm_90a only (MOEBATCH_WGMMA, kernels/CMakeLists.txt); without it prefill_on_wgmma
// says false.
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
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    o[i] = 0.f;
    wgmma::fence_operand(o[i]);
  }
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // max of c·s; lane-partial sums

  const auto wait_tile = [&](int kt) {
    wgmma::mbarrier_wait(full0 + (kt % kStages) * 8, (kt / kStages) & 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };
  const auto issue_s = [&](int kt) {
    const uint32_t k_addr = stage_addr0 + (kt % kStages) * kStageBytes;
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t q_k = q_wg + (kk >> 2) * kQSlab + (kk & 3) * 32, k_k = k_addr + (kk >> 2) * kKvSlab + (kk & 3) * 32;
      mma_ss<kKeys>(s, wgmma::smem_desc_sw128(q_k), wgmma::smem_desc_sw128(k_k), kk > 0);
    }
    wgmma::commit();
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
  };
  const auto issue_pv = [&](int kt) {
    const uint32_t v_addr = stage_addr0 + (kt % kStages) * kStageBytes + kTileBytes;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      mma_rs<D>(o, pf[kk], wgmma::smem_desc_sw128_mn(v_addr + kk * 16 * 128, kKvSlab));
    wgmma::commit();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
  };

  if (wg_tiles > 0) {
    wait_tile(0);
    issue_s(0);
  }
  clock.mark(kAttnFirstTile);
  for (int kt = 0; kt < n_tiles; ++kt) {
    wgmma::wait<0>();  // S(kt) and P·V(kt − 1)
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) wgmma::fence_operand(s[i]);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
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
      // Causal mask where a key of the tile reaches a row's bound (8-column chunk j of the
      // accumulators: keys k0 + 8j + 2t + {0, 1}; s[4j], s[4j+1] row a, s[4j+2], s[4j+3] row b).
      const int k0 = kt * kKeys;
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
      const float mn_a = fmaxf(m_a, mx_a * log2_scale), mn_b = fmaxf(m_b, mx_b * log2_scale);
      const float alpha_a = exp2f(m_a - mn_a), alpha_b = exp2f(m_b - mn_b);  // 0 on the first tile
      m_a = mn_a;
      m_b = mn_b;
      // Chunks 2kk, 2kk + 1 are a[0]/a[1], a[2]/a[3] of P·V's k16 step kk.
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
      l_a = l_a * alpha_a + sum_a;
      l_b = l_b * alpha_b + sum_b;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[4 * j] *= alpha_a;
        o[4 * j + 1] *= alpha_a;
        o[4 * j + 2] *= alpha_b;
        o[4 * j + 3] *= alpha_b;
      }
    }
    clock.mark(kAttnSoftmax);
    if (more) wait_tile(kt + 1);
    clock.mark(kAttnFullWait);
    if (active) issue_pv(kt);
    if (more) issue_s(kt + 1);
    clock.mark(kAttnIssue);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) wgmma::fence_operand(o[i]);
  cp_async_commit();
  cp_async_wait<0>();  // (every tile's copies were waited for by the warpgroup holding the last row)
  __syncthreads();  // both warpgroups are done with the stages: they hold the output tile now

  // One rounding: o / l to bf16, staged for 16-byte row stores.
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_a += __shfl_xor_sync(kFullMask, l_a, x);
    l_b += __shfl_xor_sync(kFullMask, l_b, x);
  }
  const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;  // 0: a row past n_rows
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

}  // namespace

// Where prefill takes this kernel. head_dim 128: a block has its SM to itself (225 KB of shared
// memory, 252 registers a thread), so its prologue (Q and the first K/V tiles) and epilogue
// overlap nothing; with one key tile per block (no context longer than 128 keys) that costs more
// than the faster MMAs save — 64 prompts of 128 tokens 127.8 µs against mma.sync's 110.3,
// 8 × 512 101.2 against 129.9 (bench/RESULTS.md, 2026-12-03) — so such steps stay on mma.sync.
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
  // Above the 48 KB default; set per launch, as attributes are per device.
  const auto kernel = attention_prefill_wgmma_kernel<D>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles<D>::kSmemBytes));
  launch_dependent(kernel, dim3(p.n_kv_heads, static_cast<unsigned>(row_tiles), p.num_seqs), kThreads,
                   Tiles<D>::kSmemBytes, stream, p, k_map, v_map);
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
