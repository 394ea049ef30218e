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
#include "kernels/mma.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kTileKeys = 32;  // one key per lane in the score step
constexpr float kLog2e = 1.4426950408889634f;

// Reads a lane's N consecutive bf16 in one access (8-byte for 4): conflict-free across the warp.
template <int N>
__device__ __forceinline__ void load_dims(const bf16* p, float out[N]) {
  if constexpr (N == 8) {
    load8(p, out);
  } else if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
  } else if constexpr (N == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    out[0] = a.x; out[1] = a.y;
  } else {
    static_assert(N == 1, "head_dim <= 256");
    out[0] = __bfloat162float(*p);
  }
}

// ---- Decode, and prefill shapes the tensor-core kernel does not take ------------------------
//
// Flash-style tiling on CUDA cores. A block owns kWarps*RW rows (row = (query token, head of
// the kv group)), one kv head and one split of the key range. Per 32-key tile: stage K and V
// in shared memory, scores with one key per lane, online softmax per row (base 2), then P·V with
// each lane owning head_dim/32 output dims. Empty splits write l = 0 and are ignored by the
// combine.
template <int D, int RW>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionParams p) {
  pdl_sync();
  constexpr int kRows = kWarps * RW;
  constexpr int kPad = D + 8;                   // 16-byte row reads by 8 lanes hit 8 bank groups
  constexpr int kDimsPerLane = D >= 32 ? D / 32 : 1;
  __shared__ alignas(16) float q_s[kRows][D];
  __shared__ alignas(16) bf16 k_s[kTileKeys][kPad];
  __shared__ alignas(16) bf16 v_s[kTileKeys][kPad];

  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / p.num_splits, split = blockIdx.y % p.num_splits;
  const int q0 = p.q_start[seq];
  const int n_q = p.q_start[seq + 1] - q0;
  const int kv_len = p.kv_lens[seq];
  const int group = p.n_q_heads / p.n_kv_heads;
  const int row0 = blockIdx.x * kRows;
  if (row0 >= n_q * group) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // Key range of this split, in whole tiles.
  const int split_len = CEIL_DIV(CEIL_DIV(p.max_kv_len, p.num_splits), kTileKeys) * kTileKeys;
  const int k_begin = split * split_len;
  const int last_row = min(row0 + kRows, n_q * group) - 1;
  const int block_limit = min(min(kv_len, k_begin + split_len), kv_len - n_q + last_row / group + 1);

  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D, row = row0 + r;
    float v = 0.f;
    if (row < n_q * group) {
      const int head = kvh * group + row % group;
      v = __bfloat162float(p.q[(q0 + row / group) * p.q_stride + head * D + d]) * p.scale * kLog2e;
    }
    q_s[r][d] = v;
  }

  int row_limit[RW];  // exclusive causal bound per row
  float m[RW], l[RW], acc[RW][kDimsPerLane];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int row = row0 + warp * RW + i;
    row_limit[i] = row < n_q * group ? min(block_limit, kv_len - n_q + row / group + 1) : 0;
    m[i] = -FLT_MAX;
    l[i] = 0.f;
#pragma unroll
    for (int d = 0; d < kDimsPerLane; ++d) acc[i][d] = 0.f;
  }

  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  for (int kt = k_begin; kt < block_limit; kt += kTileKeys) {
    __syncthreads();  // previous tile consumed (and q_s written, on the first pass)
    for (int idx = threadIdx.x; idx < kTileKeys * (D / 8); idx += blockDim.x) {
      const int j = idx / (D / 8), c = (idx % (D / 8)) * 8;
      const int kpos = kt + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (kpos < block_limit) {
        const int slot = table[kpos / p.block_size] * p.block_size + kpos % p.block_size;
        // size_t: slot * n_kv_heads * D overflows int for large pools.
        const size_t off = (static_cast<size_t>(slot) * p.n_kv_heads + kvh) * D + c;
        kv = *reinterpret_cast<const uint4*>(p.k_cache + off);
        vv = *reinterpret_cast<const uint4*>(p.v_cache + off);
      }
      *reinterpret_cast<uint4*>(&k_s[j][c]) = kv;
      *reinterpret_cast<uint4*>(&v_s[j][c]) = vv;
    }
    __syncthreads();

    float s[RW];
#pragma unroll
    for (int i = 0; i < RW; ++i) s[i] = 0.f;
#pragma unroll 4
    for (int c = 0; c < D; c += 8) {
      float kf[8];
      load8(&k_s[lane][c], kf);
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const float4 qa = *reinterpret_cast<const float4*>(&q_s[warp * RW + i][c]);
        const float4 qb = *reinterpret_cast<const float4*>(&q_s[warp * RW + i][c + 4]);
        s[i] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
      }
    }
    float pr[RW];
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const bool valid = kt + lane < row_limit[i];
      const float tile_max = warp_max(valid ? s[i] : -FLT_MAX);
      const float m_new = fmaxf(m[i], tile_max);
      pr[i] = valid ? exp2f(s[i] - m_new) : 0.f;
      const float alpha = m[i] == -FLT_MAX ? 0.f : exp2f(m[i] - m_new);
      l[i] = l[i] * alpha + warp_sum(pr[i]);
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) acc[i][d] *= alpha;
    }
    const int keys = min(kTileKeys, block_limit - kt);
    for (int j = 0; j < keys; ++j) {
      float vf[kDimsPerLane];
      load_dims<kDimsPerLane>(&v_s[j][(lane * kDimsPerLane) % D], vf);
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const float pj = __shfl_sync(kFullMask, pr[i], j);
#pragma unroll
        for (int d = 0; d < kDimsPerLane; ++d) acc[i][d] += pj * vf[d];
      }
    }
  }

  if (lane * kDimsPerLane >= D) return;  // head_dim < 32: surplus lanes hold copies
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int row = row0 + warp * RW + i;
    if (row >= n_q * group) continue;
    const int token = q0 + row / group, head = kvh * group + row % group;
    const float inv_l = l[i] > 0.f ? 1.f / l[i] : 0.f;
    if (p.num_splits == 1) {
      bf16* o = p.out + (static_cast<size_t>(token) * p.n_q_heads + head) * D + lane * kDimsPerLane;
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) o[d] = __float2bfloat16(acc[i][d] * inv_l);
    } else {
      // Partials per (token, head, split): D normalized outputs, then (m, l).
      float* w =
          attention_partials(p) +
          ((static_cast<size_t>(token) * p.n_q_heads + head) * p.num_splits + split) * (D + 2);
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) w[lane * kDimsPerLane + d] = acc[i][d] * inv_l;
      if (lane == 0) {
        w[D] = m[i];
        w[D + 1] = l[i];
      }
    }
  }
}

// One block of head_dim threads per (head, token): weights l_s * 2^(m_s - M) over the splits.
__global__ void attention_combine_kernel(AttentionParams p) {
  pdl_sync();
  const int head = blockIdx.x, token = blockIdx.y, d = threadIdx.x;
  const int D = p.head_dim;
  const float* w = attention_partials(p) +
                   (static_cast<size_t>(token) * p.n_q_heads + head) * p.num_splits * (D + 2);
  float mx = -FLT_MAX;
  for (int s = 0; s < p.num_splits; ++s)
    if (w[s * (D + 2) + D + 1] > 0.f) mx = fmaxf(mx, w[s * (D + 2) + D]);
  float num = 0.f, den = 0.f;
  for (int s = 0; s < p.num_splits; ++s) {
    const float* ws = w + s * (D + 2);
    if (ws[D + 1] <= 0.f) continue;
    const float c = ws[D + 1] * exp2f(ws[D] - mx);
    num += c * ws[d];
    den += c;
  }
  p.out[(static_cast<size_t>(token) * p.n_q_heads + head) * D + d] = __float2bfloat16(den > 0.f ? num / den : 0.f);
}

// ---- Prefill on tensor cores (FlashAttention-2 style) ----------------------------------------
//
// A block owns 64 · RB rows (row = (query token, head of the kv group), heads inner, as above) of
// one sequence and one kv head, so each K/V tile staged from the paged cache serves all the
// group's heads of 64 · RB / group tokens. Warp w owns 16 · RB consecutive rows: RB m16 row
// blocks of mma.sync.m16n8k16 (bf16 in, fp32 accumulate). Per 64-key tile: S = Q·Kᵀ (fp32 C
// fragments), causal mask on the tiles that reach past a row's bound, online softmax in fp32
// (base 2; the max and sum of a row live in the quad of lanes sharing it), P rounded to bf16 and
// used straight from the C fragments as the A fragments of O += P·V. K/V tiles are gathered
// through the block table by cp.async into two stages: tile t + 1 is in flight while tile t is
// multiplied.
// RB = 1 (decode, short prompts): Q stays in registers for the whole key loop. RB = 2 (long
// prompts): each K and V fragment read from shared memory feeds twice the MMAs — shared-memory
// fragment loads are what the RB = 1 kernel waits on (bench/RESULTS.md, ncu 2026-12-02) — and Q
// is read from its own shared tile per k step (its registers would not fit beside 2 × O).
// Fragment layouts (PTX ISA, lane = 4g + t): A a0 (row g, k 2t..2t+1), a1 (row g + 8), a2 (row g,
// k + 8), a3 (row g + 8, k + 8); B b0 (k 2t..2t+1, col g), b1 (k + 8); C c0/c1 (row g, cols 2t,
// 2t + 1), c2/c3 (row g + 8).
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = kTcWarps * 16;  // query rows per block and row block per warp
constexpr int kTcKeys = 64;             // keys per tile
// Rows of a (sequence, kv head) from which prefill takes RB = 2 (a block of 128 rows).
constexpr int kTcWideMinRows = 8 * kTcRows;
// Shared rows padded by 16 bytes: the 8 row addresses of an ldmatrix phase (stride D + 8
// bf16) fall in 8 distinct 16-byte bank groups for D = 32, 64, 128.
template <int D>
constexpr int kTcPad = D + 8;
template <int D>
constexpr int kTcTileElems = kTcKeys * kTcPad<D>;
// Stages s = 0, 1: K at tile 2s, V at tile 2s + 1. RB = 1: stage 1's K tile first holds the Q
// tile; RB = 2: the Q tile of 128 rows follows the stages.
template <int D, int RB>
constexpr size_t kTcSmemBytes = (4 * kTcTileElems<D> + (RB == 1 ? 0 : RB * kTcRows * kTcPad<D>)) * sizeof(bf16);
// Blocks per SM: RB 1 at D 128 fits three in 204 KB of shared memory and ≤ 168 registers a
// thread; RB 2 two (≤ 255 registers, 204 KB).
template <int D, int RB>
constexpr int kTcMinBlocks = RB == 2 ? 2 : D == 128 ? 3 : 4;
static_assert(kTcRows <= kTcKeys, "the Q tile borrows stage 1's K tile");
static_assert(kTcThreads == 2 * kTcKeys && kTcThreads == 2 * kTcRows, "two threads copy each row");

// 16-byte global → shared copy that bypasses registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// Grid: (kv head, row tile, sequence); row tiles run heaviest (most keys) first.
// Every row's exclusive key bound is lim(row) = kv_len - n_q + token + 1 ≥ 1, nondecreasing in
// the row, so key 0 is valid for every row and the first tile leaves each row max finite: later
// all-masked rows of a tile keep m (alpha = 1) and get p = 2^-inf = 0, never NaN. Rows past the
// sequence (the last tile's padding) take the last row's bound and zero q, and are not stored.
// Warps skip 16-key groups at or past their last row's bound (all p = 0 there), which trims the
// causal diagonal's wasted MMAs; a warp with no rows only joins the copies and barriers.
template <int D, int RB>
__global__ void __launch_bounds__(kTcThreads, kTcMinBlocks<D, RB>)
    attention_prefill_mma_kernel(AttentionParams p) {
  pdl_sync();
  constexpr int kPad = kTcPad<D>;
  constexpr int kChunks = D / 8;   // 16-byte chunks per K/V/Q row
  constexpr int kDSteps = D / 16;  // k16 steps of Q·Kᵀ = dim pairs of n8 blocks in P·V
  constexpr int kBlockRows = RB * kTcRows, kWarpRows = RB * 16;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  bf16* const smem = reinterpret_cast<bf16*>(attn_smem);

  const int kvh = blockIdx.x, seq = blockIdx.z;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const int q0 = p.q_start[seq];
  const int n_q = p.q_start[seq + 1] - q0;
  const int group = p.n_q_heads / p.n_kv_heads;
  const int n_rows = n_q * group;
  if (row0 >= n_rows) return;
  const int pos0 = p.kv_lens[seq] - n_q;  // position of the sequence's first query token
  const auto limit = [&](int row) { return pos0 + min(row, n_rows - 1) / group + 1; };
  const int block_limit = limit(row0 + kBlockRows - 1);
  const int n_tiles = CEIL_DIV(block_limit, kTcKeys);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // ldmatrix row addresses: lane feeds row (lane & 7) + 8·bit 3 and column 8·bit 4 of a 16 × 16
  // block, so r[0..3] = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (0-7, 8-15), (8-15, 8-15).
  const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8, ld_col = (lane >> 4) * 8;
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  const auto k_tile = [&](int stage) { return smem + 2 * stage * kTcTileElems<D>; };
  const auto v_tile = [&](int stage) { return smem + (2 * stage + 1) * kTcTileElems<D>; };
  bf16* const q_tile = RB == 1 ? k_tile(1) : smem + 4 * kTcTileElems<D>;

  // Copies: thread pair (2r, 2r + 1) moves row r of a tile, one 32-byte sector (chunks 2i,
  // 2i + 1) per step, so each thread looks up one block-table entry per key tile.
  const int cp_row = tid >> 1, cp_chunk = (tid & 1) * 8;
  const unsigned cp_dst = static_cast<unsigned>((cp_row * kPad + cp_chunk) * sizeof(bf16));
  // K and V rows of key tile kt into a stage. Keys at or past block_limit are zero-filled:
  // their p is 0, but stale shared memory may hold NaN and 0·NaN = NaN.
  const auto load_kv = [&](int kt, int stage) {
    const unsigned ks = smem_addr(k_tile(stage)) + cp_dst, vs = smem_addr(v_tile(stage)) + cp_dst;
    const int kpos = kt * kTcKeys + cp_row;
    size_t off = 0;
    int bytes = 0;
    if (kpos < block_limit) {
      const int slot = __ldg(table + kpos / p.block_size) * p.block_size + kpos % p.block_size;
      // size_t: slot * n_kv_heads * D overflows int for large pools.
      off = (static_cast<size_t>(slot) * p.n_kv_heads + kvh) * D + cp_chunk;
      bytes = 16;
    }
#pragma unroll
    for (int i = 0; i < kChunks / 2; ++i) {
      cp_async16(ks + 32 * i, p.k_cache + off + 16 * i, bytes);
      cp_async16(vs + 32 * i, p.v_cache + off + 16 * i, bytes);
    }
  };

  // Prologue: the Q tile and key tile 0; RB = 1 then takes Q's A fragments into registers.
#pragma unroll
  for (int pass = 0; pass < RB; ++pass) {
    const int row = row0 + pass * kTcRows + cp_row;
    const bf16* src = p.q;
    int bytes = 0;
    if (row < n_rows) {
      const size_t token = q0 + row / group;
      src = p.q + token * p.q_stride + (kvh * group + row % group) * D + cp_chunk;
      bytes = 16;
    }
    const unsigned qs = smem_addr(q_tile + pass * kTcRows * kPad) + cp_dst;
#pragma unroll
    for (int i = 0; i < kChunks / 2; ++i) cp_async16(qs + 32 * i, src + 16 * i, bytes);
  }
  load_kv(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const bf16* const q_warp = q_tile + warp * kWarpRows * kPad;  // this warp's rows of the Q tile
  unsigned qf[RB == 1 ? kDSteps : 1][4];
  if constexpr (RB == 1) {
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) ldmatrix_x4(smem_addr(q_warp + ld_row * kPad + kk * 16 + ld_col), qf[kk]);
    __syncthreads();  // stage 1 is free for key tile 1
  }

  const int wrow0 = row0 + warp * kWarpRows;
  const bool warp_active = wrow0 < n_rows;
  const int warp_lo = limit(wrow0), warp_hi = limit(wrow0 + kWarpRows - 1);
  int lim_a[RB], lim_b[RB];  // rows g and g + 8 of each row block
  float m_a[RB], m_b[RB], l_a[RB], l_b[RB];  // max of c·s; lane-partial sums
  float o[RB][2 * kDSteps][4];
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    lim_a[rb] = limit(wrow0 + 16 * rb + g);
    lim_b[rb] = limit(wrow0 + 16 * rb + g + 8);
    m_a[rb] = m_b[rb] = -INFINITY;
    l_a[rb] = l_b[rb] = 0.f;
#pragma unroll
    for (int n = 0; n < 2 * kDSteps; ++n) o[rb][n][0] = o[rb][n][1] = o[rb][n][2] = o[rb][n][3] = 0.f;
  }
  const float log2_scale = p.scale * kLog2e;  // scores to base-2 logits, applied in fp32

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) load_kv(kt + 1, (kt + 1) & 1);
    cp_async_commit();  // possibly empty: keeps the group count uniform for wait_group 1
    cp_async_wait<1>();
    __syncthreads();  // tile kt is in shared memory for every warp
    const int k0 = kt * kTcKeys;
    if (warp_active && k0 < warp_hi) {
      const bf16* ks = k_tile(kt & 1);
      const bf16* vs = v_tile(kt & 1);
      // S = Q·Kᵀ: n8 blocks 2jp, 2jp + 1 = keys 16jp..16jp+15. K rows are keys, so the ldmatrix
      // blocks (keys 0-7 | 8-15) × (dims 0-7 | 8-15) are b0 of block 2jp, b0 of 2jp + 1, b1 of
      // 2jp, b1 of 2jp + 1. Only the first `groups` 16-key groups: the rest lie at or past
      // warp_hi (a diagonal tile), are masked below and stay 0 here. kk outer: the 2·groups·RB
      // accumulators are independent MMA chains.
      float s[RB][8][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int j = 0; j < 8; ++j) s[rb][j][0] = s[rb][j][1] = s[rb][j][2] = s[rb][j][3] = 0.f;
      const auto qk = [&](auto groups) {
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
          unsigned a[RB][4];
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) {
            if constexpr (RB == 1) {
              a[rb][0] = qf[kk][0], a[rb][1] = qf[kk][1], a[rb][2] = qf[kk][2], a[rb][3] = qf[kk][3];
            } else {
              ldmatrix_x4(smem_addr(q_warp + (16 * rb + ld_row) * kPad + kk * 16 + ld_col), a[rb]);
            }
          }
#pragma unroll
          for (int jp = 0; jp < decltype(groups)::value; ++jp) {
            unsigned b[4];
            ldmatrix_x4(smem_addr(ks + (16 * jp + ld_row) * kPad + kk * 16 + ld_col), b);
#pragma unroll
            for (int rb = 0; rb < RB; ++rb) {
              mma_bf16_16816(s[rb][2 * jp], a[rb][0], a[rb][1], a[rb][2], a[rb][3], b[0], b[2]);
              mma_bf16_16816(s[rb][2 * jp + 1], a[rb][0], a[rb][1], a[rb][2], a[rb][3], b[1], b[3]);
            }
          }
        }
      };
      switch (CEIL_DIV(warp_hi - k0, 16)) {
        case 1: qk(std::integral_constant<int, 1>{}); break;
        case 2: qk(std::integral_constant<int, 2>{}); break;
        case 3: qk(std::integral_constant<int, 3>{}); break;
        default: qk(std::integral_constant<int, 4>{}); break;
      }
      unsigned pf[RB][4][4];  // P as the A fragments of the 4 k16 steps of P·V
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        // Causal mask where a key of the tile reaches a row's bound (skipped groups included).
        if (k0 + kTcKeys > warp_lo) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = k0 + 8 * j + 2 * t + e;
              if (key >= lim_a[rb]) s[rb][j][e] = -INFINITY;
              if (key >= lim_b[rb]) s[rb][j][2 + e] = -INFINITY;
            }
        }
        // Online softmax: the quad (t = 0..3) of lanes holds a row's 64 scores.
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          mx_a = fmaxf(mx_a, fmaxf(s[rb][j][0], s[rb][j][1]));
          mx_b = fmaxf(mx_b, fmaxf(s[rb][j][2], s[rb][j][3]));
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, x));
          mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, x));
        }
        const float mn_a = fmaxf(m_a[rb], mx_a * log2_scale), mn_b = fmaxf(m_b[rb], mx_b * log2_scale);
        const float alpha_a = exp2f(m_a[rb] - mn_a), alpha_b = exp2f(m_b[rb] - mn_b);  // 0 on the first tile
        m_a[rb] = mn_a;
        m_b[rb] = mn_b;
        // C blocks 2kk, 2kk + 1 are a0/a1, a2/a3 of P·V's k16 step kk.
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float p0 = exp2f(fmaf(s[rb][j][0], log2_scale, -mn_a));
          const float p1 = exp2f(fmaf(s[rb][j][1], log2_scale, -mn_a));
          const float p2 = exp2f(fmaf(s[rb][j][2], log2_scale, -mn_b));
          const float p3 = exp2f(fmaf(s[rb][j][3], log2_scale, -mn_b));
          sum_a += p0 + p1;
          sum_b += p2 + p3;
          pf[rb][j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
          pf[rb][j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
        l_a[rb] = l_a[rb] * alpha_a + sum_a;
        l_b[rb] = l_b[rb] * alpha_b + sum_b;
#pragma unroll
        for (int n = 0; n < 2 * kDSteps; ++n) {
          o[rb][n][0] *= alpha_a;
          o[rb][n][1] *= alpha_a;
          o[rb][n][2] *= alpha_b;
          o[rb][n][3] *= alpha_b;
        }
      }
      // O += P·V. V rows are keys: ldmatrix.trans of (keys 0-7 | 8-15) × (dims 0-7 | 8-15) gives
      // b0, b1 of dim block 2np, then b0, b1 of 2np + 1.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (k0 + 16 * kk >= warp_hi) continue;
#pragma unroll
        for (int np = 0; np < kDSteps; ++np) {
          unsigned b[4];
          ldmatrix_x4_trans(smem_addr(vs + (16 * kk + ld_row) * kPad + np * 16 + ld_col), b);
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) {
            mma_bf16_16816(o[rb][2 * np], pf[rb][kk][0], pf[rb][kk][1], pf[rb][kk][2], pf[rb][kk][3], b[0], b[1]);
            mma_bf16_16816(o[rb][2 * np + 1], pf[rb][kk][0], pf[rb][kk][1], pf[rb][kk][2], pf[rb][kk][3], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // stage kt & 1 is refilled by the next iteration's copies
  }

  if (!warp_active) return;
  // One rounding: o / l to bf16, dims 8n + 2t, 2t + 1 of rows g and g + 8, staged for 16-byte
  // stores in shared memory free after the loop's last barrier: RB = 1 this warp's 16 rows of
  // stage 0, RB = 2 its own rows of the Q tile.
  bf16* const o_s = RB == 1 ? k_tile(0) + warp * 16 * kPad : q_tile + warp * kWarpRows * kPad;
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    float la = l_a[rb], lb = l_b[rb];
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      la += __shfl_xor_sync(kFullMask, la, x);
      lb += __shfl_xor_sync(kFullMask, lb, x);
    }
    const float inv_a = 1.f / la, inv_b = 1.f / lb;  // l ≥ 1: the row max's own term
    bf16* const os = o_s + 16 * rb * kPad;
#pragma unroll
    for (int n = 0; n < 2 * kDSteps; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(os + g * kPad + 8 * n + 2 * t) =
          __floats2bfloat162_rn(o[rb][n][0] * inv_a, o[rb][n][1] * inv_a);
      *reinterpret_cast<__nv_bfloat162*>(os + (g + 8) * kPad + 8 * n + 2 * t) =
          __floats2bfloat162_rn(o[rb][n][2] * inv_b, o[rb][n][3] * inv_b);
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kWarpRows * kChunks / 32; ++i) {
    const int idx = lane + 32 * i, r = idx / kChunks, ch = idx % kChunks * 8;
    const int row = wrow0 + r;
    if (row >= n_rows) continue;
    const size_t out_row = static_cast<size_t>(q0 + row / group) * p.n_q_heads + kvh * group + row % group;
    *reinterpret_cast<uint4*>(p.out + out_row * D + ch) = *reinterpret_cast<const uint4*>(o_s + r * kPad + ch);
  }
}

void check(const AttentionParams& p) {
  MB_CHECK(p.head_dim == 16 || p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128 ||
               p.head_dim == 256,
           "attention: head_dim must be 16, 32, 64, 128 or 256");
  MB_CHECK(p.n_kv_heads > 0 && p.n_q_heads % p.n_kv_heads == 0, "attention: n_kv_heads must divide n_q_heads");
  MB_CHECK(p.block_size > 0 && p.max_blocks_per_seq > 0 && p.num_seqs <= 65535, "attention: bad paging shape");
  MB_CHECK(p.num_splits >= 1 && p.n_kv_heads * p.num_splits <= 65535, "attention: bad split count");
  MB_CHECK(p.num_splits == 1 || p.workspace != nullptr, "attention: split-K needs a workspace");
  MB_CHECK(p.q_stride % 8 == 0 && p.q_stride >= static_cast<int64_t>(p.n_q_heads) * p.head_dim, "attention: bad q_stride");
  MB_CHECK(p.out && p.q && p.k_cache && p.v_cache && p.block_tables && p.q_start && p.kv_lens,
           "attention: null operand");
  MB_CHECK(!p.rope_q || (p.rope.q == p.q && p.rope.q_stride == p.q_stride && p.rope.n_q_heads == p.n_q_heads &&
                         p.rope.head_dim == p.head_dim && p.rope.tokens == p.num_tokens),
           "attention: rope_q needs `rope` to describe q (the same rows, stride, heads and tokens)");
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <int D, int RW>
void launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kRows = kWarps * RW;
  const int group = p.n_q_heads / p.n_kv_heads;
  const dim3 grid(CEIL_DIV(p.max_q_len * group, kRows), p.n_kv_heads * p.num_splits, p.num_seqs);
  launch_dependent(attention_kernel<D, RW>, grid, kWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
  if (p.num_splits > 1) {
    launch_dependent(attention_combine_kernel, dim3(p.n_q_heads, p.num_tokens), D, 0, stream, p);
    CUDA_CHECK_LAST();
  }
}

// head_dim 256 (Qwen3-Next) always takes 2 rows per warp: its q tile at 8 rows per warp would
// exceed the 48 KB of static shared memory.
template <int RW>
void dispatch(const AttentionParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16: launch<16, RW>(p, stream); break;
    case 32: launch<32, RW>(p, stream); break;
    case 64: launch<64, RW>(p, stream); break;
    case 128: launch<128, RW>(p, stream); break;
    default: launch<256, 2>(p, stream); break;
  }
}

template <int D, int RB>
void launch_mma(const AttentionParams& p, cudaStream_t stream) {
  const int group = p.n_q_heads / p.n_kv_heads;
  const dim3 grid(p.n_kv_heads, CEIL_DIV(p.max_q_len * group, RB * kTcRows), p.num_seqs);
  // Above the 48 KB default (D 128: 68 KB, 102 KB at RB 2), and the whole carveout as shared
  // memory so that kTcMinBlocks blocks fit (the kernel barely uses L1); set per launch, as
  // attributes are per device.
  const auto kernel = attention_prefill_mma_kernel<D, RB>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kTcSmemBytes<D, RB>)));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  launch_dependent(kernel, grid, kTcThreads, kTcSmemBytes<D, RB>, stream, p);
  CUDA_CHECK_LAST();
}

// Long prompts (a (sequence, kv head) with kTcWideMinRows rows or more) take 128-row blocks at
// head_dim 128; decode and short prompts the 64-row blocks, whose tile wastes less on few rows.
template <int D>
void launch_mma(const AttentionParams& p, cudaStream_t stream) {
  if constexpr (D == 128) {
    const int64_t rows = static_cast<int64_t>(p.max_q_len) * (p.n_q_heads / p.n_kv_heads);
    if (rows >= kTcWideMinRows) return launch_mma<D, 2>(p, stream);
  }
  launch_mma<D, 1>(p, stream);
}

// Where prefill runs: the tensor-core kernels take head_dim 32/64/128 (mma.sync) and on Hopper
// 128/256 (wgmma, on_wgmma) without split-K, with 16-byte aligned q, cache and output rows
// (cp.async, TMA, vector stores) and a positive scale (they take row maxima before scaling); the
// CUDA-core kernel takes the rest (head_dim 16, 256 elsewhere, num_splits > 1, odd pointers).
// Decode takes the warp kernels of kernels/attention_decode.cu where they apply (head_dim
// 64/128, ≤ 16 query heads per kv head); otherwise without split-K the same tensor-core kernel,
// its 64-row tile holding one group's rows.
bool tensor_core_operands(const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  return p.num_splits == 1 && p.scale > 0.f && aligned(p.q, 16) && aligned(p.k_cache, 16) &&
         aligned(p.v_cache, 16) && aligned(p.out, 16) &&
         CEIL_DIV(static_cast<int64_t>(p.max_q_len) * group, kTcRows) <= 65535;
}
bool on_tensor_cores(const AttentionParams& p) {
  return p.head_dim >= 32 && p.head_dim <= 128 && tensor_core_operands(p);
}
// The wgmma kernel (Hopper): head_dim 128 where mma.sync would take 128-row tiles, and head_dim
// 256, which has no mma.sync kernel; prefill_on_wgmma has the rest.
bool on_wgmma(const AttentionParams& p) {
  const int64_t rows = static_cast<int64_t>(p.max_q_len) * (p.n_q_heads / p.n_kv_heads);
  return tensor_core_operands(p) && (p.head_dim == 256 || rows >= kTcWideMinRows) && prefill_on_wgmma(p);
}

}  // namespace

// Rounded down: the split kernel of kernels/attention_decode.cu holds two blocks per SM at
// head_dim 128 (198 registers a thread), so 2 · num_sms (sequence, kv head, split) blocks are one
// wave, and rounding up put as many as units − 1 blocks into a second wave that doubled the time.
int attention_decode_splits(int num_seqs, int n_kv_heads, int max_kv_len, int num_sms, int max_splits,
                            int min_split_keys) {
  const int units = num_seqs * n_kv_heads;  // (sequence, kv head) pairs
  if (units <= 0 || units >= num_sms) return 1;
  const int split_keys = std::max(kTileKeys, min_split_keys);
  const int splits = std::min({2 * num_sms / units, CEIL_DIV(max_kv_len, split_keys), max_splits});
  return std::max(splits, 1);
}

bool attention_prefill_rotates_q(const AttentionParams& p) { return on_wgmma(p) && wgmma_rotates_q(p); }

void attention_prefill(const AttentionParams& p, cudaStream_t stream) {
  check(p);
  if (p.num_seqs == 0 || p.num_tokens == 0 || p.max_q_len == 0) return;
  if (p.rope_q && !attention_prefill_rotates_q(p)) {
    // q's norm and rotation in place first, then plain attention
    qk_norm_rope(qk_norm_rope_q_only(p.rope), stream);
    AttentionParams plain = p;
    plain.rope_q = false;
    return attention_prefill(plain, stream);
  }
  if (on_wgmma(p)) return attention_prefill_wgmma(p, stream);
  if (!on_tensor_cores(p)) return dispatch<8>(p, stream);
  switch (p.head_dim) {
    case 32: launch_mma<32>(p, stream); break;
    case 64: launch_mma<64>(p, stream); break;
    default: launch_mma<128>(p, stream); break;
  }
}

void attention_decode(const AttentionParams& p, cudaStream_t stream) {
  check(p);
  MB_CHECK(!p.fused_rope || decode_on_warps(p),
           "attention_decode: fused_rope only on the warp kernel (decode_on_warps: num_splits 1 and at least "
           "kWarpDecodeMinUnits (sequence, kv head) pairs); the split kernel has no fused rope, run qk_norm_rope "
           "before it");
  MB_CHECK(!p.fused_rope || attention_decode_fuses_rope(p), "attention_decode: fused_rope with operands it cannot fuse");
  if (p.num_seqs == 0 || p.num_tokens == 0 || p.max_q_len == 0) return;
  if (decode_on_warps(p)) return attention_decode_warps(p, stream);
  if (decode_on_split_warps(p)) return attention_decode_split_warps(p, stream);
  if (!on_tensor_cores(p)) return dispatch<2>(p, stream);
  switch (p.head_dim) {
    case 32: launch_mma<32>(p, stream); break;
    case 64: launch_mma<64>(p, stream); break;
    default: launch_mma<128>(p, stream); break;
  }
}

}  // namespace moebatch::kernels
