// Kernel lab: the split-K expert GEMM, moved out of kernels/ (not on the engine path; see
// docs/kernels.md, "Kernel lab").
//
// Small-batch expert GEMM: at batch ≤ 8 each active expert has one 8-row tile, so the work is
// streaming ~8 experts' weights once. The pipelined kernel (moe_gemm.cu) gives a block 64 rows and
// all of k: 192 blocks at batch 1, one or two per SM, each waiting on 8 dependent chunks. Here a
// block owns 16 weight rows and its 4 warps split k, so batch 1 launches 768 (gate+up) and 1024
// (down) short blocks that spread evenly over the SMs, each warp with all its loads in flight at
// once.
#include <algorithm>

#include "bench/gpu/lab/moe_gemm_split_k.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/mma.cuh"

namespace moebatch::lab {
namespace {

using kernels::bf16;
using kernels::kMoeGemmTileM;
using kernels::mma_bf16_16816;
using kernels::MoeGemmParams;

constexpr int kWarps = 4;
constexpr int kBatchSteps = 8;  // 32-wide k steps whose loads are issued before their MMAs

// Read-only 16-byte load as volatile asm: it stays ahead of the (volatile) MMAs that follow, so
// a warp has all kBatchSteps steps of loads in flight before it waits on the first.
__device__ __forceinline__ uint4 load16(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A rows g / g + 8 of the MMA: weight rows (col, col + 8), or (gate col, up col) with kSilu.
// B columns: the tile's 8 pair rows. The k order inside a 32-wide step is permuted identically
// for A and B as in moe_gemm.cu (one 16-byte load per lane and operand feeds two MMAs).
template <bool kSilu>
__global__ void __launch_bounds__(kWarps * 32) moe_gemm_split_k_kernel(MoeGemmParams p) {
  constexpr int kColsPerBlock = kSilu ? 8 : 16;
  __shared__ float partial[kWarps][32][4];

  int e = blockIdx.y;
  if (p.active_experts != nullptr) {
    if (e >= p.active_experts[0]) return;
    e = p.active_experts[1 + e];
  }
  const int seg_begin = p.expert_offsets[e], seg_end = p.expert_offsets[e + 1];
  if (seg_begin == seg_end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int col = blockIdx.x * kColsPerBlock + g;
  const int rows_per_expert = kSilu ? 2 * p.n : p.n;
  // size_t: E·rows·k > 2^31
  const bf16* we = static_cast<const bf16*>(p.weight.data) + static_cast<size_t>(e) * rows_per_expert * p.k;
  const bf16* w0 = we + static_cast<size_t>(col) * p.k;
  const bf16* w1 = we + static_cast<size_t>(kSilu ? p.n + col : col + 8) * p.k;
  // This warp's k steps: a contiguous quarter of k (the last warps may get fewer or none).
  const int steps = p.k / 32, per_warp = (steps + kWarps - 1) / kWarps;
  const int s_begin = warp * per_warp, s_end = min(steps, s_begin + per_warp);

  for (int tile = seg_begin; tile < seg_end; tile += kMoeGemmTileM) {
    const int id = p.sorted_ids[tile + g];
    const bool real = id >= 0 && id < p.num_pairs;
    const bf16* x = p.in + static_cast<size_t>(real ? id / p.in_row_div : 0) * p.k;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s0 = s_begin; s0 < s_end; s0 += kBatchSteps) {
      uint4 a[kBatchSteps], b[kBatchSteps], xb[kBatchSteps];
      // Unconditional loads (steps past s_end re-read the last step, padding rows read row 0),
      // zeroed afterwards: no branches between the loads, so all of them issue back to back.
#pragma unroll
      for (int i = 0; i < kBatchSteps; ++i) {
        const int kk = min(s0 + i, s_end - 1) * 32 + t * 8;
        a[i] = load16(w0 + kk);
        b[i] = load16(w1 + kk);
        xb[i] = load16(x + kk);
      }
#pragma unroll
      for (int i = 0; i < kBatchSteps; ++i) {
        if (s0 + i >= s_end || !real) xb[i] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kBatchSteps; ++i) {
        mma_bf16_16816(acc, a[i].x, b[i].x, a[i].y, b[i].y, xb[i].x, xb[i].y);
        mma_bf16_16816(acc, a[i].z, b[i].z, a[i].w, b[i].w, xb[i].z, xb[i].w);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][lane][j] = acc[j];
    __syncthreads();
    if (warp == 0) {
      // Fixed summation order over the warps: results do not depend on timing or neighbours.
      float c[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        c[j] = ((partial[0][lane][j] + partial[1][lane][j]) + partial[2][lane][j]) + partial[3][lane][j];
      // C fragment: c0/c1 = (row g, tiles rows 2t, 2t+1), c2/c3 = (row g + 8, same rows).
      const int i0 = p.sorted_ids[tile + 2 * t], i1 = p.sorted_ids[tile + 2 * t + 1];
      const bool r0 = i0 >= 0 && i0 < p.num_pairs, r1 = i1 >= 0 && i1 < p.num_pairs;
      if constexpr (kSilu) {
        if (r0) p.out[static_cast<size_t>(i0) * p.n + col] = __float2bfloat16(c[0] / (1.f + expf(-c[0])) * c[2]);
        if (r1) p.out[static_cast<size_t>(i1) * p.n + col] = __float2bfloat16(c[1] / (1.f + expf(-c[1])) * c[3]);
      } else {
        if (r0) {
          bf16* o = p.out + static_cast<size_t>(i0) * p.n;
          o[col] = __float2bfloat16(c[0]);
          o[col + 8] = __float2bfloat16(c[2]);
        }
        if (r1) {
          bf16* o = p.out + static_cast<size_t>(i1) * p.n;
          o[col] = __float2bfloat16(c[1]);
          o[col + 8] = __float2bfloat16(c[3]);
        }
      }
    }
    __syncthreads();  // partial is rewritten by the next tile
  }
}

}  // namespace

void moe_gemm_split_k(const MoeGemmParams& p, cudaStream_t stream) {
  const int cols_per_block = p.silu_gate_up ? 8 : 16;
  MB_CHECK(p.n > 0 && p.n % cols_per_block == 0,
           "moe_gemm_split_k: n must be a positive multiple of 16 (8 with silu_gate_up)");
  MB_CHECK(p.k > 0 && p.k % 32 == 0, "moe_gemm_split_k: k must be a positive multiple of 32");
  MB_CHECK(p.num_experts > 0 && p.num_experts <= 65535, "moe_gemm_split_k: bad expert count");
  MB_CHECK(p.in_row_div > 0 && p.num_pairs >= 0, "moe_gemm_split_k: bad pair mapping");
  MB_CHECK(p.out && p.in && p.weight.data && p.sorted_ids && p.expert_offsets, "moe_gemm_split_k: null operand");
  MB_CHECK(p.weight.codec == kernels::WeightCodec::Bf16, "moe_gemm_split_k: bf16 weights only");
  if (p.num_pairs == 0) return;
  const int expert_blocks = p.active_experts != nullptr ? std::min(p.num_experts, p.num_pairs) : p.num_experts;
  const dim3 grid(p.n / cols_per_block, expert_blocks);
  if (p.silu_gate_up) {
    moe_gemm_split_k_kernel<true><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    moe_gemm_split_k_kernel<false><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::lab
