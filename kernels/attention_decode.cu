// Decode attention on tensor cores for large batches, one warp per (sequence, kv head): the
// group's query rows of the sequence's one new token (8 for Qwen3-MoE's 32/4 heads; ≤ 16) are one
// m16 row block of mma.sync.m16n8k16, and the warp streams its keys from the paged cache straight
// into registers, 16 keys per step: no shared memory, no block barrier, so an SM holds as many
// sequences in flight as registers allow (the prefill kernel's 64-row tile holds one group and
// stages 64 KB of K/V per block). A warp walks its whole context, so this pays only when the
// batch alone fills the GPU (kWarpDecodeMinUnits; bench/RESULTS.md has the crossover).
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

#include "kernels/attention_internal.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;  // sequences per block
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
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

template <int D>
__global__ void __launch_bounds__(kWarps * 32) attention_decode_warp_kernel(AttentionParams p) {
  pdl_sync();
  constexpr int KS = D / 16;  // k16 steps of Q·Kᵀ
  constexpr int KD = D / 4;   // K dims per lane
  constexpr int VD = D / 8;   // V dims per lane = n-blocks of P·V
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int seq = blockIdx.y * kWarps + (threadIdx.x >> 5);
  const int kvh = blockIdx.x;
  if (seq >= p.num_seqs) return;  // whole warps
  const int token = p.q_start[seq];  // one query token per sequence
  const int kv_len = p.kv_lens[seq];
  const int group = p.n_q_heads / p.n_kv_heads;
  const int k_end = kv_len;  // keys [0, kv_len)
  const int head_a = kvh * group + g, head_b = head_a + 8;  // rows g and g + 8
  const bool row_a = g < group, row_b = g + 8 < group;

  // Q's A fragments: a0/a2 = dims KD·t + 4kk + 0..1 / 2..3 of row g, a1/a3 of row g + 8.
  unsigned qf[KS][4];
  {
    const bf16* qa = p.q + static_cast<size_t>(token) * p.q_stride + static_cast<size_t>(head_a) * D + KD * t;
    const bf16* qb = qa + 8 * D;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const uint2 a = row_a ? __ldg(reinterpret_cast<const uint2*>(qa + 4 * kk)) : make_uint2(0, 0);
      const uint2 b = row_b ? __ldg(reinterpret_cast<const uint2*>(qb + 4 * kk)) : make_uint2(0, 0);
      qf[kk][0] = a.x;
      qf[kk][2] = a.y;
      qf[kk][1] = b.x;
      qf[kk][3] = b.y;
    }
  }

  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  // A 16-key step lies inside one cache block when the block size is a multiple of 16 (steps
  // start at multiples of 16): one table entry per step, fetched a step ahead.
  const bool one_block = p.block_size % 16 == 0;
  int next_base = one_block && k_end > 0 ? __ldg(table) : 0;
  int slot_base = 0;  // the step's cache block · block_size (one_block)
  const auto row_ptr = [&](const bf16* cache, int key) {
    const int slot = one_block ? slot_base + key % p.block_size
                               : __ldg(table + key / p.block_size) * p.block_size + key % p.block_size;
    return cache + (static_cast<size_t>(slot) * p.n_kv_heads + kvh) * D;
  };
  const float log2_scale = p.scale * kLog2e;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  float o[VD][4];
#pragma unroll
  for (int n = 0; n < VD; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int key0 = 0; key0 < k_end; key0 += 16) {  // warp-uniform
    slot_base = next_base * p.block_size;
    if (one_block && key0 + 16 < k_end) next_base = __ldg(table + (key0 + 16) / p.block_size);
    // Loads first (K of keys g, g + 8; V of keys 2t, 2t+1, 2t+8, 2t+9), all in flight together.
    uint4 kr[2][KD / 8], vr[4][VD / 8];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int key = key0 + 8 * j + g;
#pragma unroll
      for (int i = 0; i < KD / 8; ++i) kr[j][i] = make_uint4(0, 0, 0, 0);
      if (key < k_end) {
        const uint4* src = reinterpret_cast<const uint4*>(row_ptr(p.k_cache, key) + KD * t);
#pragma unroll
        for (int i = 0; i < KD / 8; ++i) kr[j][i] = __ldg(src + i);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = key0 + 2 * t + (j & 1) + 8 * (j >> 1);
#pragma unroll
      for (int i = 0; i < VD / 8; ++i) vr[j][i] = make_uint4(0, 0, 0, 0);
      if (key < k_end) {
        const uint4* src = reinterpret_cast<const uint4*>(row_ptr(p.v_cache, key) + VD * g);
#pragma unroll
        for (int i = 0; i < VD / 8; ++i) vr[j][i] = __ldg(src + i);
      }
    }

    // S = Q·Kᵀ for keys key0 + 8j + (0..7): B words 2kk, 2kk + 1 of the lane's K dims.
    float s[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
        mma_bf16_16816(s[j], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], word_at(kr[j], 2 * kk),
                       word_at(kr[j], 2 * kk + 1));
    // Keys past the context out.
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
    const float mn_a = fmaxf(m_a, mx_a * log2_scale), mn_b = fmaxf(m_b, mx_b * log2_scale);
    const float alpha_a = exp2f(m_a - mn_a), alpha_b = exp2f(m_b - mn_b);  // 0 on the first step
    m_a = mn_a;
    m_b = mn_b;
    float pr[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      pr[j][0] = exp2f(fmaf(s[j][0], log2_scale, -mn_a));
      pr[j][1] = exp2f(fmaf(s[j][1], log2_scale, -mn_a));
      pr[j][2] = exp2f(fmaf(s[j][2], log2_scale, -mn_b));
      pr[j][3] = exp2f(fmaf(s[j][3], log2_scale, -mn_b));
    }
    l_a = l_a * alpha_a + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
    l_b = l_b * alpha_b + pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3];
    // P's A fragments (keys 2t, 2t+1 | 2t+8, 2t+9 of rows g | g + 8).
    const unsigned pa0 = pack2(pr[0][0], pr[0][1]), pa1 = pack2(pr[0][2], pr[0][3]);
    const unsigned pa2 = pack2(pr[1][0], pr[1][1]), pa3 = pack2(pr[1][2], pr[1][3]);
    // O += P·V: n-block np takes element np of the lane's V dims from keys (2t, 2t+1) and
    // (2t+8, 2t+9), paired into bf16x2 B words.
#pragma unroll
    for (int np = 0; np < VD; ++np) {
      o[np][0] *= alpha_a;
      o[np][1] *= alpha_a;
      o[np][2] *= alpha_b;
      o[np][3] *= alpha_b;
      const unsigned b0 = half_at(vr[0], np) | half_at(vr[1], np) << 16;
      const unsigned b1 = half_at(vr[2], np) | half_at(vr[3], np) << 16;
      mma_bf16_16816(o[np], pa0, pa1, pa2, pa3, b0, b1);
    }
  }

#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_a += __shfl_xor_sync(kFullMask, l_a, x);
    l_b += __shfl_xor_sync(kFullMask, l_b, x);
  }
  // Lane (g, t) holds dims [2VD·t, 2VD·t + 2VD) of rows g (c0: dim 2VD·t + np, c1: + VD) and
  // g + 8 (c2, c3).
  const int d0 = 2 * VD * t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = r == 0 ? row_a : row_b;
    if (!valid) continue;
    const int head = r == 0 ? head_a : head_b;
    const float l = r == 0 ? l_a : l_b;
    const float inv = l > 0.f ? 1.f / l : 0.f;  // l ≥ 1 with a context; 0 keys (empty) give 0
    unsigned w[VD];  // bf16 pairs of dims d0 + 2i, d0 + 2i + 1
#pragma unroll
    for (int i = 0; i < VD; ++i) {
      const int e0 = 2 * i, e1 = 2 * i + 1;  // dims d0 + e: from c(2r) at np = e, or c(2r+1) at e − VD
      const float x0 = e0 < VD ? o[e0][2 * r] : o[e0 - VD][2 * r + 1];
      const float x1 = e1 < VD ? o[e1][2 * r] : o[e1 - VD][2 * r + 1];
      w[i] = pack2(x0 * inv, x1 * inv);
    }
    uint4* dst = reinterpret_cast<uint4*>(p.out + (static_cast<size_t>(token) * p.n_q_heads + head) * D + d0);
#pragma unroll
    for (int i = 0; i < VD / 4; ++i) dst[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

template <int D>
void launch(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.n_kv_heads, CEIL_DIV(p.num_seqs, kWarps));
  launch_dependent(attention_decode_warp_kernel<D>, grid, kWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool decode_on_warps(const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  return (p.head_dim == 64 || p.head_dim == 128) && group <= 16 && p.max_q_len == 1 &&
         p.num_splits == 1 && p.scale > 0.f &&
         static_cast<int64_t>(p.num_seqs) * p.n_kv_heads >= kWarpDecodeMinUnits && p.q_stride % 8 == 0 &&
         aligned16(p.q) && aligned16(p.k_cache) && aligned16(p.v_cache) && aligned16(p.out) &&
         CEIL_DIV(p.num_seqs, kWarps) <= 65535;
}

void attention_decode_warps(const AttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch<64>(p, stream);
  else
    launch<128>(p, stream);
}

}  // namespace moebatch::kernels
