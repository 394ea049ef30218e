#include "kernels/cuda_check.cuh"
#include "kernels/moe_gemm.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 16;              // weight rows: the MMA's M side
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kTilesPerPass = 4;              // token tiles of 8 held in registers at once
constexpr int kPassRows = kTilesPerPass * kMoeGemmTileM;
constexpr int kChunk = 256;                   // k elements staged per barrier
// +32 bf16 per row: 16-byte reads of rows g and g+1 at column t*8 fall in distinct bank groups.
constexpr int kChunkPad = kChunk + 32;

__device__ __forceinline__ void mma_bf16_16816(float c[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Swapped product: C[weight row, token] = W · Xᵀ, so the 8-wide MMA N side carries tokens
// (decode has few per expert) and the 16-wide M side carries weight rows.
// The k order inside each 32-wide step is permuted identically for A and B (a dot product does
// not care): lane (g, t) loads 8 consecutive k at t*8 with one 16-byte load, and registers .x/.y
// feed the first MMA, .z/.w the second.
__global__ void __launch_bounds__(kWarps * 32) moe_gemm_kernel(MoeGemmParams p) {
  __shared__ alignas(16) bf16 xs[kPassRows][kChunkPad];
  __shared__ int src_row[kPassRows];
  __shared__ int dst_row[kPassRows];

  const int e = blockIdx.y;
  const int seg_begin = p.expert_offsets[e], seg_end = p.expert_offsets[e + 1];
  if (seg_begin == seg_end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
  const bool warp_active = warp_row0 < p.n;  // n % 16 == 0: a warp's rows are all in or all out
  const int n0 = warp_row0 + g;
  // size_t: e * n * k overflows int for real expert stacks.
  const bf16* w0 = p.weight + (static_cast<size_t>(e) * p.n + (warp_active ? n0 : 0)) * p.k;
  const bf16* w1 = w0 + static_cast<size_t>(8) * p.k;

  for (int pass = seg_begin; pass < seg_end; pass += kPassRows) {
    const int rows = min(kPassRows, seg_end - pass);  // multiple of 8 (padded segments)
    const int tiles = rows / kMoeGemmTileM;
    __syncthreads();  // the previous pass is done with src_row/dst_row/xs
    if (threadIdx.x < kPassRows) {
      const int id = threadIdx.x < rows ? p.sorted_ids[pass + threadIdx.x] : p.num_pairs;
      const bool real = id >= 0 && id < p.num_pairs;
      dst_row[threadIdx.x] = real ? id : -1;
      src_row[threadIdx.x] = real ? id / p.in_row_div : -1;
    }
    float acc[kTilesPerPass][4] = {};
    for (int kc = 0; kc < p.k; kc += kChunk) {
      const int kw = min(kChunk, p.k - kc);
      // Weight loads first: they are in flight while the activations are staged.
      uint4 wa[kChunk / 32], wb[kChunk / 32];
#pragma unroll
      for (int s = 0; s < kChunk / 32; ++s) {
        wa[s] = wb[s] = make_uint4(0, 0, 0, 0);
        if (warp_active && s * 32 < kw) {
          wa[s] = *reinterpret_cast<const uint4*>(w0 + kc + s * 32 + t * 8);
          wb[s] = *reinterpret_cast<const uint4*>(w1 + kc + s * 32 + t * 8);
        }
      }
      __syncthreads();  // xs is free; src_row is written
      const int vecs = kw / 8;
      for (int idx = threadIdx.x; idx < tiles * kMoeGemmTileM * vecs; idx += blockDim.x) {  // live tiles only
        const int r = idx / vecs, c = idx % vecs;
        const int src = src_row[r];
        uint4 val = make_uint4(0, 0, 0, 0);
        if (src >= 0) val = *reinterpret_cast<const uint4*>(p.in + static_cast<size_t>(src) * p.k + kc + c * 8);
        *reinterpret_cast<uint4*>(&xs[r][c * 8]) = val;
      }
      __syncthreads();
#pragma unroll
      for (int s = 0; s < kChunk / 32; ++s) {
        if (s * 32 >= kw) break;
#pragma unroll
        for (int tile = 0; tile < kTilesPerPass; ++tile) {
          if (tile >= tiles) break;
          const uint4 xb = *reinterpret_cast<const uint4*>(&xs[tile * 8 + g][s * 32 + t * 8]);
          mma_bf16_16816(acc[tile], wa[s].x, wb[s].x, wa[s].y, wb[s].y, xb.x, xb.y);
          mma_bf16_16816(acc[tile], wa[s].z, wb[s].z, wa[s].w, wb[s].w, xb.z, xb.w);
        }
      }
    }
    if (!warp_active) continue;
    // C fragment: c0/c1 = (row g, tokens 2t, 2t+1), c2/c3 = (row g+8, same tokens).
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass; ++tile) {
      if (tile >= tiles) break;
      const int d0 = dst_row[tile * 8 + 2 * t], d1 = dst_row[tile * 8 + 2 * t + 1];
      if (d0 >= 0) {
        bf16* o = p.out + static_cast<size_t>(d0) * p.n;
        o[n0] = __float2bfloat16(acc[tile][0]);
        o[n0 + 8] = __float2bfloat16(acc[tile][2]);
      }
      if (d1 >= 0) {
        bf16* o = p.out + static_cast<size_t>(d1) * p.n;
        o[n0] = __float2bfloat16(acc[tile][1]);
        o[n0 + 8] = __float2bfloat16(acc[tile][3]);
      }
    }
  }
}

}  // namespace

void moe_gemm(const MoeGemmParams& p, cudaStream_t stream) {
  MB_CHECK(p.n > 0 && p.n % 16 == 0, "moe_gemm: n must be a positive multiple of 16");
  MB_CHECK(p.k > 0 && p.k % 32 == 0, "moe_gemm: k must be a positive multiple of 32");
  MB_CHECK(p.num_experts > 0 && p.num_experts <= 65535, "moe_gemm: bad expert count");
  MB_CHECK(p.in_row_div > 0 && p.num_pairs >= 0, "moe_gemm: bad pair mapping");
  MB_CHECK(p.out && p.in && p.weight && p.sorted_ids && p.expert_offsets, "moe_gemm: null operand");
  if (p.num_pairs == 0) return;
  const dim3 grid(CEIL_DIV(p.n, kRowsPerBlock), p.num_experts);
  moe_gemm_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
