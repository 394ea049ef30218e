#include <algorithm>
#include <cfloat>

#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kTileKeys = 32;  // one key per lane in the score step
constexpr float kLog2e = 1.4426950408889634f;

// Reads a lane's N consecutive bf16 in one access (8-byte for 4): conflict-free across the warp.
template <int N>
__device__ __forceinline__ void load_dims(const bf16* p, float out[N]) {
  if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
  } else if constexpr (N == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    out[0] = a.x; out[1] = a.y;
  } else {
    static_assert(N == 1, "head_dim <= 128");
    out[0] = __bfloat162float(*p);
  }
}

// Flash-style tiling on CUDA cores. A block owns kWarps*RW rows (row = (query token, head of
// the kv group)), one kv head and one split of the key range. Per 32-key tile: stage K and V
// in shared memory, scores with one key per lane, online softmax per row (base 2), then P·V with
// each lane owning head_dim/32 output dims. Empty splits write l = 0 and are ignored by the
// combine.
template <int D, int RW>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionParams p) {
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
      // Workspace per (token, head, split): D normalized outputs, then (m, l).
      float* w = p.workspace + ((static_cast<size_t>(token) * p.n_q_heads + head) * p.num_splits + split) * (D + 2);
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
  const int head = blockIdx.x, token = blockIdx.y, d = threadIdx.x;
  const int D = p.head_dim;
  const float* w = p.workspace + (static_cast<size_t>(token) * p.n_q_heads + head) * p.num_splits * (D + 2);
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

void check(const AttentionParams& p) {
  MB_CHECK(p.head_dim == 16 || p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128,
           "attention: head_dim must be 16, 32, 64 or 128");
  MB_CHECK(p.n_kv_heads > 0 && p.n_q_heads % p.n_kv_heads == 0, "attention: n_kv_heads must divide n_q_heads");
  MB_CHECK(p.block_size > 0 && p.max_blocks_per_seq > 0 && p.num_seqs <= 65535, "attention: bad paging shape");
  MB_CHECK(p.num_splits >= 1 && p.n_kv_heads * p.num_splits <= 65535, "attention: bad split count");
  MB_CHECK(p.num_splits == 1 || p.workspace != nullptr, "attention: split-K needs a workspace");
  MB_CHECK(p.q_stride % 8 == 0 && p.q_stride >= static_cast<int64_t>(p.n_q_heads) * p.head_dim, "attention: bad q_stride");
  MB_CHECK(p.out && p.q && p.k_cache && p.v_cache && p.block_tables && p.q_start && p.kv_lens,
           "attention: null operand");
}

template <int D, int RW>
void launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kRows = kWarps * RW;
  const int group = p.n_q_heads / p.n_kv_heads;
  const dim3 grid(CEIL_DIV(p.max_q_len * group, kRows), p.n_kv_heads * p.num_splits, p.num_seqs);
  attention_kernel<D, RW><<<grid, kWarps * 32, 0, stream>>>(p);
  CUDA_CHECK_LAST();
  if (p.num_splits > 1) {
    attention_combine_kernel<<<dim3(p.n_q_heads, p.num_tokens), D, 0, stream>>>(p);
    CUDA_CHECK_LAST();
  }
}

template <int RW>
void dispatch(const AttentionParams& p, cudaStream_t stream) {
  check(p);
  if (p.num_seqs == 0 || p.num_tokens == 0 || p.max_q_len == 0) return;
  switch (p.head_dim) {
    case 16: launch<16, RW>(p, stream); break;
    case 32: launch<32, RW>(p, stream); break;
    case 64: launch<64, RW>(p, stream); break;
    default: launch<128, RW>(p, stream); break;
  }
}

}  // namespace

int attention_decode_splits(int num_seqs, int n_kv_heads, int max_kv_len, int num_sms, int max_splits) {
  const int blocks = num_seqs * n_kv_heads;
  int splits = blocks > 0 ? CEIL_DIV(2 * num_sms, blocks) : 1;
  splits = std::min(splits, CEIL_DIV(max_kv_len, 256));
  splits = std::min(splits, max_splits);
  return splits < 1 ? 1 : splits;
}

void attention_prefill(const AttentionParams& p, cudaStream_t stream) { dispatch<8>(p, stream); }

void attention_decode(const AttentionParams& p, cudaStream_t stream) { dispatch<2>(p, stream); }

}  // namespace moebatch::kernels
