// Decode attention on tensor cores, K and V streamed from the paged cache straight into MMA
// fragments. One warp's formulation (DecodeWarp): the group's query rows of the sequence's one
// new token (8 for Qwen3-MoE's 32/4 heads; ≤ 16) are one m16 row block of mma.sync.m16n8k16, and
// the warp loads its keys into registers, 16 keys per step: no shared memory and no block barrier
// in the key loop. Two kernels walk keys this way:
//   - attention_decode_warp_kernel (large batches): one warp per (sequence, kv head) walks the
//     whole context, so an SM holds as many sequences in flight as registers allow (the prefill
//     kernel's 64-row tile holds one group and stages 64 KB of K/V per block). It pays only when
//     the batch alone fills the GPU (kWarpDecodeMinUnits; bench/RESULTS.md has the crossover).
//     With AttentionParams::fused_rope it also does qk_norm_rope's work for its sequence (q/k
//     norm, rotation, the new k / v written to the cache): one launch less per decode layer.
//   - attention_decode_split_kernel (below that): split-K over the key range, a block of 4 warps
//     per (split, kv head, sequence) taking alternate 16-key steps. The block merges its warps in
//     shared memory and, with several splits, writes the split's partial to the workspace and
//     takes a ticket; the pair's last split to arrive merges all of them and writes the output
//     (with AttentionParams::cluster_merge and 2..8 splits the pair's splits run as one thread
//     block cluster and merge through each other's shared memory instead). One launch: at batch 1
//     a layer reads ~0.3 MB of K/V, so the step is latency, and the CUDA-core split kernel plus
//     its combine launch cost ~14 µs (ncu, H200). Each warp's first step of keys that earlier
//     forward calls wrote is loaded before pdl_sync (decode_prefetch). No fused rope here: the
//     new k / v come from the qk_norm_rope launch before it (fusing measured slower at batch 1,
//     with and without staging the new rows in shared memory: attention_decode_fuses_rope).
//
// The dimensions are permuted so that every lane's operands are contiguous in a cache row (a dot
// product and an output column do not care about order, as long as both sides agree):
//   Q·Kᵀ: in k16 step kk, MMA positions 2t, 2t+1, 2t+8, 2t+9 of lane t are dims
//         KD·t + 4kk + 0..3 (KD = D/4), for Q's A fragments and K's B fragments alike, so lane
//         (g, t) loads dims [KD·t, KD·t + KD) of keys g and g + 8 of the step (B columns = keys).
//   P·V:  output column g of n-block np is dim VD·g + np (VD = D/8), so lane (g, t) loads dims
//         [VD·g, VD·g + VD) of keys 2t, 2t+1, 2t+8, 2t+9 (B rows = keys, P's k order natural),
//         and its C fragment (row g / g+8, columns 2t, 2t+1) holds dims [2VD·t, 2VD·t + 2VD).
// Scores to base-2 logits in fp32, online softmax per row over the quad of lanes sharing it, P
// rounded to bf16 as the A fragments of P·V (the prefill kernel's arithmetic).

#include <cooperative_groups.h>

#include "kernels/attention_internal.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;         // sequences per block of the warp kernel
constexpr int kSplitWarps = 4;    // warps per split of the split kernel
constexpr int kCombineBatch = 8;  // splits whose partials a thread of the last block loads at once
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}
__device__ __forceinline__ float2 unpack2(unsigned w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// Word w (compile-time after unrolling) of a register array of 16-byte vectors, by component:
// indexing a reinterpreted pointer instead would put the array in local memory.
template <int N>
__device__ __forceinline__ unsigned word_at(const uint4 (&v)[N], int w) {
  const uint4& q = v[w >> 2];
  switch (w & 3) {
    case 0: return q.x;
    case 1: return q.y;
    case 2: return q.z;
    default: return q.w;
  }
}
// bf16 element e of the same, as the low 16 bits.
template <int N>
__device__ __forceinline__ unsigned half_at(const uint4 (&v)[N], int e) {
  return (word_at(v, e >> 1) >> (16 * (e & 1))) & 0xffffu;
}

// One warp's decode state for the query rows of one (token, kv head): Q's A fragments, the online
// softmax of rows g and g + 8 (lane = 4g + t) and O's C fragments.
template <int D>
struct DecodeWarp {
  static constexpr int KS = D / 16;  // k16 steps of Q·Kᵀ
  static constexpr int KD = D / 4;   // K dims per lane
  static constexpr int VD = D / 8;   // V dims per lane = n-blocks of P·V
  int g, t;
  unsigned qf[KS][4];
  float m_a, m_b;  // row maxima in base-2 logits; -inf before the first key
  float l_a, l_b;  // row sums relative to 2^m: this lane's keys until decode_sum_rows
  float o[VD][4];  // unnormalized, relative to 2^m
};

// Normalises (w: the head's norm weights, nullptr for none) and rotates (NEOX, every dim) one
// head held by a quad of lanes: lane t has dims [KD·t, KD·t + KD) in x, and the rotation partner
// of each (dim ± D/2) sits at the same place in lane t ^ 2. cs: the token's row of the forward's
// (cos, sin) table. qk_norm_rope's arithmetic: the fp32 norm, weights as (offset + w), then the
// rotation of the normalised values. Every lane of the warp calls it (shuffles).
template <int D>
__device__ __forceinline__ void quad_norm_rope(float (&x)[D / 4], const bf16* w, const float2* cs,
                                               float offset, float eps, int t) {
  constexpr int KD = D / 4;
  if (w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < KD; ++e) ss += x[e] * x[e];
    ss += __shfl_xor_sync(kFullMask, ss, 1);
    ss += __shfl_xor_sync(kFullMask, ss, 2);
    const float rstd = rsqrtf(ss / D + eps);
#pragma unroll
    for (int e = 0; e < KD; e += 8) {
      float wf[8];
      load8(w + KD * t + e, wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[e + j] = x[e + j] * rstd * (offset + wf[j]);
    }
  }
  // lanes t < 2 hold the first half (a·cos − b·sin), t ≥ 2 the second (b·cos + a·sin); both
  // halves' dim i pairs with rotation pair KD·(t & 1) + i
  const float sign = t < 2 ? -1.f : 1.f;
  const float4* pairs = reinterpret_cast<const float4*>(cs + KD * (t & 1));
#pragma unroll
  for (int e = 0; e < KD; e += 2) {
    const float4 c = __ldg(pairs + e / 2);  // (cos, sin) of pairs e and e + 1
    const float p0 = __shfl_xor_sync(kFullMask, x[e], 2), p1 = __shfl_xor_sync(kFullMask, x[e + 1], 2);
    x[e] = fmaf(sign * p0, c.y, x[e] * c.x);
    x[e + 1] = fmaf(sign * p1, c.w, x[e + 1] * c.z);
  }
}

// Q's A fragments of heads head0 + g and head0 + g + 8 (rows at or past `group` stay 0: their
// scores are 0 and never stored), and an empty softmax state. kRope: q is the raw qkv row,
// normalised and rotated here (AttentionParams::fused_rope).
template <int D, bool kRope>
__device__ __forceinline__ void decode_begin(DecodeWarp<D>& w, const AttentionParams& p, int token,
                                             int head0, int group) {
  constexpr int KS = DecodeWarp<D>::KS, KD = DecodeWarp<D>::KD, VD = DecodeWarp<D>::VD;
  const int lane = threadIdx.x & 31;
  w.g = lane >> 2;
  w.t = lane & 3;
  const bool row_a = w.g < group, row_b = w.g + 8 < group;
  // a0/a2 = dims KD·t + 4kk + 0..1 / 2..3 of row g, a1/a3 of row g + 8.
  const bf16* qa = p.q + static_cast<size_t>(token) * p.q_stride +
                   static_cast<size_t>(head0 + w.g) * D + KD * w.t;
  const bf16* qb = qa + 8 * D;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const uint2 a = row_a ? __ldg(reinterpret_cast<const uint2*>(qa + 4 * kk)) : make_uint2(0, 0);
    const uint2 b = row_b ? __ldg(reinterpret_cast<const uint2*>(qb + 4 * kk)) : make_uint2(0, 0);
    w.qf[kk][0] = a.x;
    w.qf[kk][2] = a.y;
    w.qf[kk][1] = b.x;
    w.qf[kk][3] = b.y;
  }
  if constexpr (kRope) {
    const float2* cs = p.rope.rotation + static_cast<size_t>(token) * (D / 2);
    // row r's words: qf[kk][r] = dims 4kk + 0..1, qf[kk][2 + r] = dims 4kk + 2..3
    for (int r = 0; r < (group > 8 ? 2 : 1); ++r) {
      float x[KD];
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const float2 lo = unpack2(r == 0 ? w.qf[kk][0] : w.qf[kk][1]);
        const float2 hi = unpack2(r == 0 ? w.qf[kk][2] : w.qf[kk][3]);
        x[4 * kk] = lo.x;
        x[4 * kk + 1] = lo.y;
        x[4 * kk + 2] = hi.x;
        x[4 * kk + 3] = hi.y;
      }
      quad_norm_rope<D>(x, p.rope.q_norm, cs, p.rope.norm_offset, p.rope.eps, w.t);
      const bool real = r == 0 ? row_a : row_b;  // rows past the group stay 0
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const unsigned lo = real ? pack2(x[4 * kk], x[4 * kk + 1]) : 0u;
        const unsigned hi = real ? pack2(x[4 * kk + 2], x[4 * kk + 3]) : 0u;
        if (r == 0) {
          w.qf[kk][0] = lo;
          w.qf[kk][2] = hi;
        } else {
          w.qf[kk][1] = lo;
          w.qf[kk][3] = hi;
        }
      }
    }
  }
  w.m_a = w.m_b = -INFINITY;
  w.l_a = w.l_b = 0.f;
#pragma unroll
  for (int n = 0; n < VD; ++n) w.o[n][0] = w.o[n][1] = w.o[n][2] = w.o[n][3] = 0.f;
}

// AttentionParams::fused_rope: the new token's k of kv head kvh, normalised and rotated, and its
// v into the token's cache slot (none when the slot is negative), by one whole warp: every quad
// computes k alike, quad 0 stores it; lanes below D / 8 copy v.
template <int D>
__device__ __forceinline__ void decode_write_new_kv(const QkNormRopeParams& r, int token, int kvh) {
  constexpr int KD = D / 4;
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int slot = r.slot_mapping[token];
  if (slot < 0) return;  // warp-uniform
  const bf16* k = r.k + static_cast<size_t>(token) * r.k_stride + static_cast<size_t>(kvh) * D + KD * t;
  float x[KD];
#pragma unroll
  for (int e = 0; e < KD; e += 8) load8(k + e, x + e);
  quad_norm_rope<D>(x, r.k_norm, r.rotation + static_cast<size_t>(token) * (D / 2), r.norm_offset, r.eps, t);
  // size_t: slot * n_kv_heads * D overflows int for large pools
  const size_t at = (static_cast<size_t>(slot) * r.n_kv_heads + kvh) * D;
  if (lane < 4) {
#pragma unroll
    for (int e = 0; e < KD; e += 8) store8(r.k_cache + at + KD * t + e, x + e);
  }
  if (lane < D / 8) {
    const uint4 v = __ldg(
        reinterpret_cast<const uint4*>(r.v + static_cast<size_t>(token) * r.v_stride + static_cast<size_t>(kvh) * D) +
        lane);
    reinterpret_cast<uint4*>(r.v_cache + at)[lane] = v;
  }
}

// A warp's K and V registers of one 16-key step: K of keys g, g + 8 and V of keys 2t, 2t+1,
// 2t+8, 2t+9 (lane 4g + t). Keys never loaded stay 0 (their scores are masked; V must be finite).
template <int D>
struct DecodeKv {
  uint4 k[2][DecodeWarp<D>::KD / 8];
  uint4 v[4][DecodeWarp<D>::VD / 8];
};

template <int D>
__device__ __forceinline__ void decode_clear(DecodeKv<D>& kv) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < DecodeWarp<D>::KD / 8; ++i) kv.k[j][i] = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < DecodeWarp<D>::VD / 8; ++i) kv.v[j][i] = make_uint4(0, 0, 0, 0);
}

// N 16-byte granules of a K or V cache row into dst; kCoherent: through L2 (__ldcg), which sees
// rows written earlier in the same launch (the warp kernel's fused rope) and leaves no L1 line
// behind (decode_prefetch), else through the read-only path (__ldg).
template <int N, bool kCoherent>
__device__ __forceinline__ void load_granules(uint4 (&dst)[N], const bf16* src) {
  const uint4* g = reinterpret_cast<const uint4*>(src);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = kCoherent ? __ldcg(g + i) : __ldg(g + i);
}

// The keys of the step at key0 that lie in [lo, hi) into kv, all loads in flight together; the
// registers of the step's other keys are left as they are. row(cache, key): a key's cache row of
// the warp's kv head.
template <int D, bool kCoherent, typename RowPtr>
__device__ __forceinline__ void decode_load(DecodeKv<D>& kv, const RowPtr& row, const bf16* k_cache,
                                            const bf16* v_cache, int key0, int lo, int hi) {
  constexpr int KD = DecodeWarp<D>::KD, VD = DecodeWarp<D>::VD;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int key = key0 + 8 * j + g;
    if (key >= lo && key < hi) load_granules<KD / 8, kCoherent>(kv.k[j], row(k_cache, key) + KD * t);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int key = key0 + 2 * t + (j & 1) + 8 * (j >> 1);
    if (key >= lo && key < hi) load_granules<VD / 8, kCoherent>(kv.v[j], row(v_cache, key) + VD * g);
  }
}

// One 16-key step over keys key0 + 0..15 (key0 < k_end; keys at or past k_end masked) on the
// step's K and V registers: S = Q·Kᵀ, online softmax, O += P·V.
template <int D>
__device__ __forceinline__ void decode_step(DecodeWarp<D>& w, const DecodeKv<D>& kv, int key0, int k_end,
                                            float log2_scale) {
  constexpr int KS = DecodeWarp<D>::KS, VD = DecodeWarp<D>::VD;
  const int t = w.t;
  const auto& kr = kv.k;
  const auto& vr = kv.v;

  // S = Q·Kᵀ for keys key0 + 8j + (0..7): B words 2kk, 2kk + 1 of the lane's K dims.
  float s[2][4] = {};
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
      mma_bf16_16816(s[j], w.qf[kk][0], w.qf[kk][1], w.qf[kk][2], w.qf[kk][3],
                     word_at(kr[j], 2 * kk), word_at(kr[j], 2 * kk + 1));
  // Keys past the range out.
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (key0 + 8 * j + 2 * t + e >= k_end) s[j][e] = s[j][2 + e] = -INFINITY;
  // Online softmax; the quad of lanes t = 0..3 holds a row's 16 scores. Key key0 is valid, so
  // the maxima are finite after the first step.
  float mx_a = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
  float mx_b = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, x));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, x));
  }
  const float mn_a = fmaxf(w.m_a, mx_a * log2_scale), mn_b = fmaxf(w.m_b, mx_b * log2_scale);
  const float alpha_a = exp2f(w.m_a - mn_a), alpha_b = exp2f(w.m_b - mn_b);  // 0 on the first step
  w.m_a = mn_a;
  w.m_b = mn_b;
  float pr[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    pr[j][0] = exp2f(fmaf(s[j][0], log2_scale, -mn_a));
    pr[j][1] = exp2f(fmaf(s[j][1], log2_scale, -mn_a));
    pr[j][2] = exp2f(fmaf(s[j][2], log2_scale, -mn_b));
    pr[j][3] = exp2f(fmaf(s[j][3], log2_scale, -mn_b));
  }
  w.l_a = w.l_a * alpha_a + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
  w.l_b = w.l_b * alpha_b + pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3];
  // P's A fragments (keys 2t, 2t+1 | 2t+8, 2t+9 of rows g | g + 8).
  const unsigned pa0 = pack2(pr[0][0], pr[0][1]), pa1 = pack2(pr[0][2], pr[0][3]);
  const unsigned pa2 = pack2(pr[1][0], pr[1][1]), pa3 = pack2(pr[1][2], pr[1][3]);
  // O += P·V: n-block np takes element np of the lane's V dims from keys (2t, 2t+1) and
  // (2t+8, 2t+9), paired into bf16x2 B words.
#pragma unroll
  for (int np = 0; np < VD; ++np) {
    w.o[np][0] *= alpha_a;
    w.o[np][1] *= alpha_a;
    w.o[np][2] *= alpha_b;
    w.o[np][3] *= alpha_b;
    const unsigned b0 = half_at(vr[0], np) | half_at(vr[1], np) << 16;
    const unsigned b1 = half_at(vr[2], np) | half_at(vr[3], np) << 16;
    mma_bf16_16816(w.o[np], pa0, pa1, pa2, pa3, b0, b1);
  }
}

// Key `key`'s cache slot by its own block-table entry (table: the sequence's row of it).
__device__ __forceinline__ int table_slot(const int32_t* table, const AttentionParams& p, int key) {
  return __ldg(table + key / p.block_size) * p.block_size + key % p.block_size;
}

// A cache row (slot) of kv head kvh. size_t: slot * n_kv_heads * D overflows int for large pools.
template <int D>
__device__ __forceinline__ const bf16* cache_row(const bf16* cache, const AttentionParams& p, int slot, int kvh) {
  return cache + (static_cast<size_t>(slot) * p.n_kv_heads + kvh) * D;
}

// Before pdl_sync: the keys of the step at k0 below `end` into kv, under the kernel before. An
// exception to launch.cuh's contract, sound because nothing a kernel of this forward call writes
// is read: the block table is a step input (uploaded, after a stream sync, before the call's
// first kernel), and the rows below the new token's were written by earlier forward calls — a
// decode chunk holds each sequence once (step_chunk.cpp), so no other row of the chunk writes
// a slot of this range. Through L2 (__ldcg): never an L1 line that could later stand in for the
// new token's row. Each key looks up its own table entry.
template <int D>
__device__ __forceinline__ void decode_prefetch(DecodeKv<D>& kv, const AttentionParams& p, int seq, int kvh,
                                                int k0, int end) {
  decode_clear(kv);
  if (k0 >= end) return;  // warp-uniform
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  const auto row = [&](const bf16* cache, int key) {
    return cache_row<D>(cache, p, table_slot(table, p, key), kvh);
  };
  decode_load<D, true>(kv, row, p.k_cache, p.v_cache, k0, k0, end);
}

// Steps at keys k0, k0 + stride, ... below k_end (k0 and stride multiples of 16) of sequence
// seq's cache rows of kv head kvh; warp-uniform. With `first`, step k0's keys below first_end
// are already in it (decode_prefetch): only the rest of that step is loaded. kCoherent: the
// loads go through L2 (load_granules).
template <int D, bool kCoherent>
__device__ __forceinline__ void decode_keys(DecodeWarp<D>& w, const AttentionParams& p, int seq,
                                            int kvh, int k0, int k_end, int stride,
                                            const DecodeKv<D>* first = nullptr, int first_end = 0) {
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  // A 16-key step lies inside one cache block when the block size is a multiple of 16 (steps
  // start at multiples of 16): one table entry per step, fetched a step ahead (any entry of the
  // row may be read; it is used only below k_end).
  const bool one_block = p.block_size % 16 == 0;
  int next_base =
      one_block && k0 / p.block_size < p.max_blocks_per_seq ? __ldg(table + k0 / p.block_size) : 0;
  int slot_base = 0;  // the step's cache block · block_size (one_block)
  const auto row = [&](const bf16* cache, int key) {
    const int slot = one_block ? slot_base + key % p.block_size : table_slot(table, p, key);
    return cache_row<D>(cache, p, slot, kvh);
  };
  const float log2_scale = p.scale * kLog2e;
  // the step at key0 from kv, whose keys below lo are already there
  const auto step = [&](int key0, DecodeKv<D>& kv, int lo) {
    slot_base = next_base * p.block_size;
    if (one_block && key0 + stride < k_end)
      next_base = __ldg(table + (key0 + stride) / p.block_size);
    decode_load<D, kCoherent>(kv, row, p.k_cache, p.v_cache, key0, lo, k_end);
    decode_step(w, kv, key0, k_end, log2_scale);
  };
  int key0 = k0;
  if (first != nullptr && key0 < k_end) {  // peeled: `first` dies here (~200 registers, not 254)
    DecodeKv<D> kv = *first;
    step(key0, kv, first_end);
    key0 += stride;
  }
  for (; key0 < k_end; key0 += stride) {
    DecodeKv<D> kv;
    decode_clear(kv);
    step(key0, kv, key0);
  }
}

// Row sums over the quad: every lane of it then holds the rows' full l.
template <int D>
__device__ __forceinline__ void decode_sum_rows(DecodeWarp<D>& w) {
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    w.l_a += __shfl_xor_sync(kFullMask, w.l_a, x);
    w.l_b += __shfl_xor_sync(kFullMask, w.l_b, x);
  }
}

// Unnormalized output dim 2VD·t + e of row g + 8r (e < 2VD, compile-time): lane (g, t) holds
// dims [2VD·t, 2VD·t + 2VD) of rows g (c0: dim 2VD·t + np, c1: + VD) and g + 8 (c2, c3).
template <int D>
__device__ __forceinline__ float decode_out(const DecodeWarp<D>& w, int r, int e) {
  constexpr int VD = DecodeWarp<D>::VD;
  return e < VD ? w.o[e][2 * r] : w.o[e - VD][2 * r + 1];
}

// kRope (AttentionParams::fused_rope): the warp first writes its sequence's new k and v to the
// cache (qk_norm_rope's work), then reads its keys through L2 (__ldcg), where those writes are.
template <int D, bool kRope>
__global__ void __launch_bounds__(kWarps * 32) attention_decode_warp_kernel(AttentionParams p) {
  if (p.trigger_early) pdl_trigger_early();
  pdl_sync();
  constexpr int VD = DecodeWarp<D>::VD;
  const int seq = blockIdx.y * kWarps + (threadIdx.x >> 5);
  const int kvh = blockIdx.x;
  if (seq >= p.num_seqs) return;     // whole warps
  const int token = p.q_start[seq];  // one query token per sequence
  const int kv_len = p.kv_lens[seq];
  const int group = p.n_q_heads / p.n_kv_heads;
  DecodeWarp<D> w;
  if constexpr (kRope) {
    if (kv_len > 0) decode_write_new_kv<D>(p.rope, token, kvh);
    __syncwarp();
  }
  decode_begin<D, kRope>(w, p, token, kvh * group, group);
  decode_keys<D, kRope>(w, p, seq, kvh, 0, kv_len, 16);  // keys [0, kv_len)
  decode_sum_rows(w);
  const int d0 = 2 * VD * w.t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = w.g + 8 * r;
    if (row >= group) continue;
    const float l = r == 0 ? w.l_a : w.l_b;
    const float inv = l > 0.f ? 1.f / l : 0.f;  // l ≥ 1 with a context; 0 keys (empty) give 0
    unsigned o[VD];                             // bf16 pairs of dims d0 + 2i, d0 + 2i + 1
#pragma unroll
    for (int i = 0; i < VD; ++i)
      o[i] = pack2(decode_out(w, r, 2 * i) * inv, decode_out(w, r, 2 * i + 1) * inv);
    uint4* dst = reinterpret_cast<uint4*>(
        p.out + (static_cast<size_t>(token) * p.n_q_heads + kvh * group + row) * D + d0);
#pragma unroll
    for (int i = 0; i < VD / 4; ++i)
      dst[i] = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
  }
}

// Dims d..d+3 of a head's output row: o / l in bf16 (0 where l = 0: no keys).
template <int D>
__device__ __forceinline__ void store_out4(const AttentionParams& p, int token, int head, int d,
                                           float4 o, float l) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  *reinterpret_cast<uint2*>(p.out + (static_cast<size_t>(token) * p.n_q_heads + head) * D + d) =
      make_uint2(pack2(o.x * inv, o.y * inv), pack2(o.z * inv, o.w * inv));
}

__device__ __forceinline__ void fma4(float4& acc, float c, float4 x) {
  acc.x = fmaf(c, x.x, acc.x);
  acc.y = fmaf(c, x.y, acc.y);
  acc.z = fmaf(c, x.z, acc.z);
  acc.w = fmaf(c, x.w, acc.w);
}

// The merge of a pair's split partials for one (row, 4 dims) item: split s weighted by
// 2^(m_s − M), as attention_combine_kernel (a neutral partial weighs 0), over batches of splits
// whose (m, l) and o are loaded together, M taken online: a running max, the sums so far
// rescaled when a batch raises it. partial(s, ml, o) loads split s's; both merges (workspace and
// cluster) go through here, so they agree bit for bit.
template <typename Partial>
__device__ __forceinline__ void merge_partials(int splits, const Partial& partial, float4& o, float& l) {
  float mx = -INFINITY;
  l = 0.f;
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < splits; s0 += kCombineBatch) {
    float2 ml[kCombineBatch];
    float4 x[kCombineBatch];
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      ml[j] = make_float2(-INFINITY, 0.f);
      x[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s0 + j < splits) partial(s0 + j, ml[j], x[j]);
    }
    float mn = mx;
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) mn = fmaxf(mn, ml[j].x);
    const float base = mn == -INFINITY ? 0.f : mn;  // no keys so far: every weight 2^-inf = 0
    const float alpha = exp2f(mx - base);
    l *= alpha;
    o = make_float4(o.x * alpha, o.y * alpha, o.z * alpha, o.w * alpha);
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const float c = exp2f(ml[j].x - base);
      l = fmaf(c, ml[j].y, l);
      fma4(o, c, x[j]);
    }
    mx = mn;
  }
}

// Grid (split, kv head, sequence), kSplitWarps warps. Split s covers keys [s·len, (s + 1)·len) of
// [0, kv_len), len = max_kv_len / num_splits rounded up to 16 keys; warp w takes the split's
// steps w, w + kSplitWarps, ... A split without keys (an empty context, or past a short
// sequence's end) yields the neutral partial m = -inf, l = 0, o = 0.
// Workspace (num_splits > 1): after the counters, o[token, kv head, split, group row, D], then
// (m, l)[token, kv head, split, group row] — o relative to 2^m, m in base-2 logits.
// The new token's k and v are in the cache already (the qk_norm_rope launch before it): this
// kernel takes no AttentionParams::fused_rope (attention_decode_fuses_rope).
// kCluster (AttentionParams::cluster_merge; launched in clusters of num_splits blocks along x,
// 2..kAttentionClusterMaxSplits): each split keeps its partial in its shared memory, and after
// the cluster meets, split r merges items r·kThreads.. of every split's, read across the
// cluster — no workspace, fence or ticket.
template <int D, bool kCluster>
__global__ void __launch_bounds__(kSplitWarps * 32)
    attention_decode_split_kernel(AttentionParams p) {
  constexpr int kLaneDims = 2 * DecodeWarp<D>::VD;  // a lane's dims of a row
  // (row, t) pieces padded by 16 bytes: the 8 lanes of a 16-byte store phase (pieces 4g + t of
  // g = 0, 1) start in distinct 4-bank groups.
  constexpr int kPad = kLaneDims + 4;
  constexpr int kChunks = D / 4;  // 4-dim chunks of a row: one merge item each
  constexpr int kThreads = kSplitWarps * 32;
  __shared__ alignas(16) float o_s[kSplitWarps][16 * 4][kPad];  // warp, 4 · row + t, dims
  __shared__ float2 ml_s[kSplitWarps][16];                      // warp's (m, l) per row
  __shared__ alignas(16) float cpart_o[kCluster ? 16 * D : 4];  // kCluster: the split's partial o
  __shared__ float2 cpart_ml[kCluster ? 16 : 1];                // and (m, l), per group row
  __shared__ bool last;
  if (p.trigger_early) pdl_trigger_early();
  // step inputs (uploaded before the step's first kernel): readable before pdl_sync
  const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int splits = p.num_splits, warp = threadIdx.x >> 5;
  const int token = p.q_start[seq];  // one query token per sequence
  const int kv_len = p.kv_lens[seq];
  const int group = p.n_q_heads / p.n_kv_heads;
  const int split_len = CEIL_DIV(CEIL_DIV(p.max_kv_len, splits), 16) * 16;
  const int k_begin = split * split_len;
  const int k_end = min(kv_len, k_begin + split_len);
  // The warp's first step of keys, all but the new token's (at kv_len − 1: written by the
  // kernel before), loaded under the kernel before — at batch 1 the step's only one, and its
  // cache round trip was half of this kernel's time.
  const int first_key = k_begin + 16 * warp, settled_end = min(k_end, kv_len - 1);
  DecodeKv<D> first;
  decode_prefetch<D>(first, p, seq, kvh, first_key, settled_end);
  pdl_sync();

  DecodeWarp<D> w;
  const bool traced = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
  decode_begin<D, /*kRope=*/false>(w, p, token, kvh * group, group);
  STEP_TRACE_MARK_IF(traced);  // q in registers (diagnostic builds)
  decode_keys<D, /*kCoherent=*/false>(w, p, seq, kvh, first_key, k_end, 16 * kSplitWarps, &first, settled_end);
  decode_sum_rows(w);
  STEP_TRACE_MARK_IF(traced);  // the warp's keys walked

  // Each warp's (m, l) of its rows and the lane's dims of rows g, g + 8 to shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = w.g + 8 * r;
    if (row >= group) continue;
    if (w.t == 0) ml_s[warp][row] = r == 0 ? make_float2(w.m_a, w.l_a) : make_float2(w.m_b, w.l_b);
    float* dst = o_s[warp][4 * row + w.t];
#pragma unroll
    for (int i = 0; i < kLaneDims / 4; ++i)
      *reinterpret_cast<float4*>(dst + 4 * i) =
          make_float4(decode_out(w, r, 4 * i), decode_out(w, r, 4 * i + 1),
                      decode_out(w, r, 4 * i + 2), decode_out(w, r, 4 * i + 3));
  }
  __syncthreads();

  // The split's partial: warp v weighted by 2^(m_v − M), M the largest m_v (a warp without keys
  // weighs 2^-inf = 0; with none in the whole split every weight is 0). One split: the output.
  const size_t pair = static_cast<size_t>(token) * p.n_kv_heads + kvh;  // (token, kv head)
  float* const part_o = attention_partials(p);
  float2* const part_ml = reinterpret_cast<float2*>(part_o + static_cast<size_t>(p.num_tokens) *
                                                                 p.n_q_heads * splits * D);
  for (int i = threadIdx.x; i < group * kChunks; i += kThreads) {
    const int row = i / kChunks, d = i % kChunks * 4;
    float2 ml[kSplitWarps];
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < kSplitWarps; ++v) {
      ml[v] = ml_s[v][row];
      mx = fmaxf(mx, ml[v].x);
    }
    const float base = mx == -INFINITY ? 0.f : mx;
    float l = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int v = 0; v < kSplitWarps; ++v) {
      const float c = exp2f(ml[v].x - base);
      l = fmaf(c, ml[v].y, l);
      fma4(o, c, *reinterpret_cast<const float4*>(&o_s[v][4 * row + d / kLaneDims][d % kLaneDims]));
    }
    if (splits == 1) {
      store_out4<D>(p, token, kvh * group + row, d, o, l);
      continue;
    }
    if constexpr (kCluster) {
      *reinterpret_cast<float4*>(cpart_o + row * D + d) = o;
      if (d == 0) cpart_ml[row] = make_float2(mx, l);
    } else {
      const size_t at = (pair * splits + split) * group + row;
      *reinterpret_cast<float4*>(part_o + at * D + d) = o;
      if (d == 0) part_ml[at] = make_float2(mx, l);
    }
  }
  STEP_TRACE_MARK_IF(traced);  // the split's partial stored
  if (splits == 1) return;
  // Items item0, item0 + stride, ... of the pair's output, each merged over the splits
  // (partial(s, row, d, ml, o): split s's) and stored.
  const auto merge_items = [&](int item0, int stride, const auto& partial) {
    for (int i = item0; i < group * kChunks; i += stride) {
      const int row = i / kChunks, d = i % kChunks * 4;
      float4 o;
      float l;
      merge_partials(splits, [&](int s, float2& ml, float4& x) { partial(s, row, d, ml, x); }, o, l);
      store_out4<D>(p, token, kvh * group + row, d, o, l);
    }
  };
  if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's partial is in its shared memory
    merge_items(split * kThreads + threadIdx.x, splits * kThreads, [&](int s, int row, int d, float2& ml, float4& x) {
      ml = cluster.map_shared_rank(cpart_ml, s)[row];
      x = *reinterpret_cast<const float4*>(cluster.map_shared_rank(cpart_o, s) + row * D + d);
    });
    cluster.sync();  // no split leaves while another still reads its partial
#else
    __trap();  // launched in clusters on compute capability 9.0 only
#endif
    return;
  }

  // Ticket: the pair's last split to arrive merges them all. Every thread fences its partial
  // stores before the block takes its ticket; the last block fences again before reading.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* const counter = attention_counters(p) + static_cast<size_t>(seq) * p.n_kv_heads + kvh;
    last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
    if (last) *counter = 0;  // every split has its ticket: zero again for the next launch (graphs)
  }
  __syncthreads();
  if (!last) return;
  STEP_TRACE_MARK_IF(threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0);  // kv head 0's last split
  __threadfence();
  // merge_partials over the workspace. __ldcg: L2, never a line this SM's L1 may hold from an
  // earlier block.
  const float2* const ml_src = part_ml + pair * splits * group;   // [split, row]
  const float* const o_src = part_o + pair * splits * group * D;  // [split, row, D]
  merge_items(threadIdx.x, kThreads, [&](int s, int row, int d, float2& ml, float4& x) {
    ml = __ldcg(ml_src + s * group + row);
    x = __ldcg(reinterpret_cast<const float4*>(o_src + (static_cast<size_t>(s) * group + row) * D + d));
  });
}

template <int D>
void launch(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.n_kv_heads, CEIL_DIV(p.num_seqs, kWarps));
  launch_dependent(p.fused_rope ? attention_decode_warp_kernel<D, true> : attention_decode_warp_kernel<D, false>, grid,
                   kWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
}

template <int D>
void launch_split(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.num_splits, p.n_kv_heads, p.num_seqs);
  if (attention_decode_merges_in_clusters(p))
    launch_dependent_clusters(attention_decode_split_kernel<D, true>, grid, kSplitWarps * 32, 0, p.num_splits,
                              stream, p);
  else
    launch_dependent(attention_decode_split_kernel<D, false>, grid, kSplitWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
}

// What both kernels need: one query token per sequence, head_dim 64 or 128, at most 16 query
// heads per kv head (one m16 block), a positive scale (maxima are taken before scaling) and
// 16-byte aligned rows.
bool on_decode_warps(const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  return (p.head_dim == 64 || p.head_dim == 128) && group <= 16 && p.max_q_len == 1 &&
         p.scale > 0.f && p.q_stride % 8 == 0 && aligned16(p.q) && aligned16(p.k_cache) &&
         aligned16(p.v_cache) && aligned16(p.out);
}

int64_t decode_units(const AttentionParams& p) {
  return static_cast<int64_t>(p.num_seqs) * p.n_kv_heads;
}

}  // namespace

bool decode_on_warps(const AttentionParams& p) {
  return on_decode_warps(p) && p.num_splits == 1 && decode_units(p) >= kWarpDecodeMinUnits &&
         CEIL_DIV(p.num_seqs, kWarps) <= 65535;
}

void attention_decode_warps(const AttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch<64>(p, stream);
  else
    launch<128>(p, stream);
}

bool decode_on_split_warps(const AttentionParams& p) {
  return on_decode_warps(p) && p.num_splits >= 1 && decode_units(p) < kWarpDecodeMinUnits &&
         (p.num_splits == 1 || aligned16(p.workspace));
}

bool attention_decode_fuses_rope(const AttentionParams& p) {
  const QkNormRopeParams& r = p.rope;
  const auto rows16 = [](const void* base, int64_t stride) { return aligned16(base) && stride % 8 == 0; };
  return decode_on_warps(p) && r.q == p.q && r.q_stride == p.q_stride &&
         r.k_cache == p.k_cache && r.v_cache == p.v_cache && r.k_cache != nullptr && r.v_cache != nullptr &&
         r.rotation != nullptr && r.slot_mapping != nullptr && r.tokens == p.num_tokens &&
         r.n_q_heads == p.n_q_heads && r.n_kv_heads == p.n_kv_heads && r.head_dim == p.head_dim &&
         rope_rotated_dims(r.rotary_dim, r.head_dim) == r.head_dim && rows16(r.k, r.k_stride) &&
         rows16(r.v, r.v_stride) && aligned16(r.rotation) && (r.q_norm == nullptr || aligned16(r.q_norm)) &&
         (r.k_norm == nullptr || aligned16(r.k_norm));
}

bool attention_decode_merges_in_clusters(const AttentionParams& p) {
  return p.cluster_merge && decode_on_split_warps(p) && p.num_splits >= 2 &&
         p.num_splits <= kAttentionClusterMaxSplits && device_has_clusters();
}

void attention_decode_split_warps(const AttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch_split<64>(p, stream);
  else
    launch_split<128>(p, stream);
}

}  // namespace moebatch::kernels
