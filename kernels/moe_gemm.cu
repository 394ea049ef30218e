#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/mma.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kTilesPerPass = 4;              // token tiles of 8 held in registers at once
constexpr int kPassRows = kTilesPerPass * kMoeGemmTileM;
constexpr int kChunk = 256;                   // k elements per pipeline stage
constexpr int kSteps = kChunk / 32;           // 32-wide k steps per chunk (two MMAs each)
// +32 bf16 per row: 16-byte reads of rows g and g+1 at column t*8 fall in distinct bank groups.
constexpr int kChunkPad = kChunk + 32;

// One chunk of a warp's two weight rows (A rows g and g+8), 8 consecutive k per lane per step.
struct WeightChunk {
  uint4 a[kSteps];
  uint4 b[kSteps];
};

// 16-byte global → shared copy that bypasses registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

struct PassState {
  const bf16* w0;  // weight row of A rows g
  const bf16* w1;  // weight row of A rows g + 8
  bool warp_active;
  int tiles;
  int nchunks;
};

// Software pipeline, two stages: while chunk c is multiplied, the weights of chunk c + 1 are in
// flight in registers and its activations are copied into the other shared buffer (cp.async), so
// each block keeps one to two chunks of weight bytes in flight instead of stalling per chunk.
__device__ __forceinline__ void pipeline_step(const MoeGemmParams& p, const PassState& st,
                                              bf16 (*xs)[kPassRows][kChunkPad], const int* src_row,
                                              float (&acc)[kTilesPerPass][4], const WeightChunk& cur,
                                              WeightChunk& nxt, int c) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (c + 1 < st.nchunks) {
    const int kc = (c + 1) * kChunk, kw = min(kChunk, p.k - kc);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (st.warp_active && s * 32 < kw) {
        nxt.a[s] = *reinterpret_cast<const uint4*>(st.w0 + kc + s * 32 + t * 8);
        nxt.b[s] = *reinterpret_cast<const uint4*>(st.w1 + kc + s * 32 + t * 8);
      } else {
        nxt.a[s] = nxt.b[s] = make_uint4(0, 0, 0, 0);
      }
    }
    const int vecs = kw / 8;
    bf16(*x)[kChunkPad] = xs[(c + 1) & 1];
    for (int idx = threadIdx.x; idx < st.tiles * kMoeGemmTileM * vecs; idx += blockDim.x) {
      const int r = idx / vecs, v = idx % vecs;
      const int src = src_row[r];
      const bf16* from = src >= 0 ? p.in + static_cast<size_t>(src) * p.k + kc + v * 8 : p.in;
      cp_async16(&x[r][v * 8], from, src >= 0 ? 16 : 0);
    }
  }
  cp_async_commit();  // possibly empty: keeps the group count uniform for wait_group 1
  cp_async_wait_one();
  __syncthreads();  // chunk c's activations are in shared memory for every warp
  const int kw = min(kChunk, p.k - c * kChunk);
  const bf16(*x)[kChunkPad] = xs[c & 1];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s * 32 >= kw) break;
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass; ++tile) {
      if (tile >= st.tiles) break;
      const uint4 xb = *reinterpret_cast<const uint4*>(&x[tile * 8 + g][s * 32 + t * 8]);
      mma_bf16_16816(acc[tile], cur.a[s].x, cur.b[s].x, cur.a[s].y, cur.b[s].y, xb.x, xb.y);
      mma_bf16_16816(acc[tile], cur.a[s].z, cur.b[s].z, cur.a[s].w, cur.b[s].w, xb.z, xb.w);
    }
  }
  __syncthreads();  // xs[c & 1] is refilled by the next step's copies
}

// Swapped product: C[weight row, token] = W · Xᵀ, so the 8-wide MMA N side carries tokens
// (decode has few per expert) and the 16-wide M side carries weight rows.
// The k order inside each 32-wide step is permuted identically for A and B (a dot product does
// not care): lane (g, t) loads 8 consecutive k at t*8 with one 16-byte load, and registers .x/.y
// feed the first MMA, .z/.w the second.
// kSilu: A rows g are gate rows and g + 8 the matching up rows, so each lane holds gate and up
// of the same (column, token) in c0/c2 and c1/c3 and applies SiLU·mul before the one rounding.
// Three blocks per SM (≤ 168 registers): enough weight bytes in flight per SM at every batch.
template <bool kSilu>
__global__ void __launch_bounds__(kWarps * 32, 3) moe_gemm_kernel(MoeGemmParams p) {
  constexpr int kColsPerWarp = kSilu ? 8 : 16;
  constexpr int kColsPerBlock = kWarps * kColsPerWarp;
  __shared__ alignas(16) bf16 xs[2][kPassRows][kChunkPad];
  __shared__ int src_row[kPassRows];
  __shared__ int dst_row[kPassRows];

  int e = blockIdx.y;
  if (p.active_experts != nullptr) {
    if (e >= p.active_experts[0]) return;
    e = p.active_experts[1 + e];
  }
  const int seg_begin = p.expert_offsets[e], seg_end = p.expert_offsets[e + 1];
  if (seg_begin == seg_end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int col0 = blockIdx.x * kColsPerBlock + warp * kColsPerWarp;
  PassState st;
  st.warp_active = col0 < p.n;  // n is a multiple of kColsPerWarp: a warp is all in or all out
  st.nchunks = (p.k + kChunk - 1) / kChunk;
  const int col = col0 + g;
  const int rows_per_expert = kSilu ? 2 * p.n : p.n;
  const int row_a = st.warp_active ? col : 0;
  const int row_b = st.warp_active ? (kSilu ? p.n + col : col + 8) : 0;
  // size_t: e * rows * k overflows int for real expert stacks.
  const bf16* we = p.weight + static_cast<size_t>(e) * rows_per_expert * p.k;
  st.w0 = we + static_cast<size_t>(row_a) * p.k;
  st.w1 = we + static_cast<size_t>(row_b) * p.k;

  for (int pass = seg_begin; pass < seg_end; pass += kPassRows) {
    const int rows = min(kPassRows, seg_end - pass);  // multiple of 8 (padded segments)
    st.tiles = rows / kMoeGemmTileM;
    __syncthreads();  // the previous pass is done with src_row/dst_row
    if (threadIdx.x < kPassRows) {
      const int id = threadIdx.x < rows ? p.sorted_ids[pass + threadIdx.x] : p.num_pairs;
      const bool real = id >= 0 && id < p.num_pairs;
      dst_row[threadIdx.x] = real ? id : -1;
      src_row[threadIdx.x] = real ? id / p.in_row_div : -1;
    }
    __syncthreads();
    float acc[kTilesPerPass][4] = {};
    WeightChunk wa, wb;
    // Prologue: chunk 0 goes into wa / xs[0] through the step for chunk -1's slot.
    {
      const int kw = min(kChunk, p.k);
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        if (st.warp_active && s * 32 < kw) {
          wa.a[s] = *reinterpret_cast<const uint4*>(st.w0 + s * 32 + t * 8);
          wa.b[s] = *reinterpret_cast<const uint4*>(st.w1 + s * 32 + t * 8);
        } else {
          wa.a[s] = wa.b[s] = make_uint4(0, 0, 0, 0);
        }
      }
      const int vecs = kw / 8;
      for (int idx = threadIdx.x; idx < st.tiles * kMoeGemmTileM * vecs; idx += blockDim.x) {
        const int r = idx / vecs, v = idx % vecs;
        const int src = src_row[r];
        const bf16* from = src >= 0 ? p.in + static_cast<size_t>(src) * p.k + v * 8 : p.in;
        cp_async16(&xs[0][r][v * 8], from, src >= 0 ? 16 : 0);
      }
      cp_async_commit();
    }
    // Two calls per iteration with the buffers swapped: register arrays keep compile-time indices.
    for (int c = 0; c < st.nchunks; c += 2) {
      pipeline_step(p, st, xs, src_row, acc, wa, wb, c);
      if (c + 1 < st.nchunks) pipeline_step(p, st, xs, src_row, acc, wb, wa, c + 1);
    }
    if (!st.warp_active) continue;
    // C fragment: c0/c1 = (row g, tokens 2t, 2t+1), c2/c3 = (row g+8, same tokens).
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass; ++tile) {
      if (tile >= st.tiles) break;
      const int d0 = dst_row[tile * 8 + 2 * t], d1 = dst_row[tile * 8 + 2 * t + 1];
      if constexpr (kSilu) {
        const float* c4 = acc[tile];
        if (d0 >= 0) p.out[static_cast<size_t>(d0) * p.n + col] = __float2bfloat16(c4[0] / (1.f + expf(-c4[0])) * c4[2]);
        if (d1 >= 0) p.out[static_cast<size_t>(d1) * p.n + col] = __float2bfloat16(c4[1] / (1.f + expf(-c4[1])) * c4[3]);
      } else {
        if (d0 >= 0) {
          bf16* o = p.out + static_cast<size_t>(d0) * p.n;
          o[col] = __float2bfloat16(acc[tile][0]);
          o[col + 8] = __float2bfloat16(acc[tile][2]);
        }
        if (d1 >= 0) {
          bf16* o = p.out + static_cast<size_t>(d1) * p.n;
          o[col] = __float2bfloat16(acc[tile][1]);
          o[col + 8] = __float2bfloat16(acc[tile][3]);
        }
      }
    }
  }
}

}  // namespace

void moe_gemm(const MoeGemmParams& p, cudaStream_t stream) {
  const int col_multiple = p.silu_gate_up ? 8 : 16;
  MB_CHECK(p.n > 0 && p.n % col_multiple == 0,
           "moe_gemm: n must be a positive multiple of 16 (8 with silu_gate_up)");
  MB_CHECK(p.k > 0 && p.k % 32 == 0, "moe_gemm: k must be a positive multiple of 32");
  MB_CHECK(p.num_experts > 0 && p.num_experts <= 65535, "moe_gemm: bad expert count");
  MB_CHECK(p.in_row_div > 0 && p.num_pairs >= 0, "moe_gemm: bad pair mapping");
  MB_CHECK(p.out && p.in && p.weight && p.sorted_ids && p.expert_offsets, "moe_gemm: null operand");
  if (p.num_pairs == 0) return;
  const int cols_per_block = kWarps * col_multiple;
  const int expert_blocks = p.active_experts != nullptr ? std::min(p.num_experts, p.num_pairs) : p.num_experts;
  const dim3 grid(CEIL_DIV(p.n, cols_per_block), expert_blocks);
  if (p.silu_gate_up) {
    moe_gemm_kernel<true><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    moe_gemm_kernel<false><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
