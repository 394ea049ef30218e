// Grouped expert GEMV for decode steps (≤ kMoeGemvMaxTokens tokens): block row y takes the y-th
// expert with pairs (moe_align's active list); each warp owns R weight rows of that expert and
// walks all of k once (kernels/gemv_device.cuh) for the expert's ≤ M pairs, whose input rows
// come from its sorted_ids segment. With SwiGLU fused, a warp's rows are gate rows j.. and their
// up rows n + j.., so the epilogue has both sums of each output.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/gemv_device.cuh"
#include "kernels/gemv_mma_device.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_gemm.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;

// The expert block row y serves (e) and its ≤ M pairs: the head of its sorted_ids segment (real
// pairs first, then the sentinel num_pairs), or with direct_topk at one token pair y itself.
// False when block row y has no expert (past the active list). Both walks start here.
template <int M>
__device__ __forceinline__ bool block_expert_pairs(const MoeGemmParams& p, int& e, int (&pair)[M], int& count) {
  const bool direct = M == 1 && p.direct_topk;  // block y: pair y of the one token
  if (static_cast<int>(blockIdx.y) >= (direct ? p.num_pairs : __ldcg(p.active_experts))) return false;
  e = __ldcg((direct ? p.sorted_ids : p.active_experts + 1) + blockIdx.y);
  const int* seg = direct ? nullptr : p.sorted_ids + __ldcg(p.expert_offsets + e);
  count = 0;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    pair[i] = direct ? static_cast<int>(blockIdx.y) : __ldcg(seg + i);
    count += pair[i] < p.num_pairs;
  }
  return true;
}

template <WeightCodec C, int M, int R, bool kSilu>
__global__ void __launch_bounds__(kWarps * 32) moe_gemv_kernel(MoeGemmParams p) {
  // Settled routing is complete before this grid was scheduled (the kernel before waited, then
  // let it launch), but it is read from L2 (__ldcg): this SM's L1 may hold older lines of it.
  if (!p.routing_settled) pdl_sync();
  constexpr int kOut = kSilu ? R / 2 : R;  // outputs per warp
  int e, pair[M], count;
  if (!block_expert_pairs<M>(p, e, pair, count)) return;
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && e >= 0);  // expert known
  const int lane = threadIdx.x & 31;
  const int out0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kOut;
  if (out0 >= p.n) return;  // whole warps only: the shuffles below need all 32 lanes
  const int rows_per_expert = kSilu ? 2 * p.n : p.n;
  int rows[R];  // outputs past n (last warp) read row n - 1 and are not stored
#pragma unroll
  for (int r = 0; r < kOut; ++r) {
    const int j = min(out0 + r, p.n - 1);
    rows[r] = e * rows_per_expert + j;
    if constexpr (kSilu) rows[kOut + r] = e * rows_per_expert + p.n + j;
  }
  // A sentinel pair reads the first pair's row and is not stored.
  const bf16* xrows[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int src = pair[i] < p.num_pairs ? pair[i] : pair[0];
    xrows[i] = p.in + static_cast<size_t>(src / p.in_row_div) * p.k;
  }
  float acc[R][M];
  // waits after its first weight loads; only then reads the input rows
  gemv_rows<C, M, R>(p.weight, p.k, rows, xrows, count, acc);  // sentinels cost nothing

  // kOut · M ≤ 32 outputs; lane r · M + i stores output (r, i).
#pragma unroll
  for (int r = 0; r < kOut; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i >= count) break;  // warp-uniform
      float v = warp_sum(acc[r][i]);
      if constexpr (C == WeightCodec::Nvfp4) v *= __ldg(p.weight.row_scales + rows[r]);
      if constexpr (kSilu) {
        float u = warp_sum(acc[kOut + r][i]);
        if constexpr (C == WeightCodec::Nvfp4) u *= __ldg(p.weight.row_scales + rows[kOut + r]);
        v = v / (1.f + expf(-v)) * u;
      }
      if (lane == r * M + i && out0 + r < p.n)
        p.out[static_cast<size_t>(pair[i]) * p.n + out0 + r] = __float2bfloat16_rn(v);
    }
  }
}

// The tensor-core form (kernels/gemv_mma_device.cuh) for the 4-bit codecs: a block is one
// 16-row tile of expert y — with SwiGLU gate rows j0.. (tile rows 0-7) and their up rows (8-15),
// so a lane ends with both sums of its outputs — its four warps taking every fourth granule quad
// of k; their fragments meet in shared memory, summed in warp order (deterministic), and warp 0
// stores. The tile's 8 B columns are the expert's ≤ M pairs.
// Registers capped for 5 blocks per SM (ptxas: 96, 0-16 bytes of spills; uncapped 128-156).
// Capped for 6 (80 registers: one wave for the 30B gate+up's 768 blocks, 20-90 bytes of spills)
// the nvfp4 / int4 steps measured 1-2% slower (bench/RESULTS.md, session 20).
template <WeightCodec C, int M, bool kSilu>
__global__ void __launch_bounds__(kWarps * 32, 5) moe_gemv_mma_kernel(MoeGemmParams p) {
  if (!p.routing_settled) pdl_sync();
  int e, pair[M], count;
  if (!block_expert_pairs<M>(p, e, pair, count)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane >> 2, t = lane & 3;
  constexpr int kTileOut = kSilu ? 8 : 16;  // outputs per block
  const int j0 = blockIdx.x * kTileOut;
  const int rows_per_expert = kSilu ? 2 * p.n : p.n;
  const int rows[2] = {e * rows_per_expert + j0 + q, e * rows_per_expert + (kSilu ? p.n : 8) + j0 + q};
  // B column q takes pair q's input row, columns past the real pairs the first pair's.
  int xpair = pair[0];
#pragma unroll
  for (int i = 1; i < M; ++i)
    if (i == q && i < count) xpair = pair[i];
  const bf16* xrow = p.in + static_cast<size_t>(xpair / p.in_row_div) * p.k;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  gemv_tile_mma<C>(p.weight, p.k, rows, xrow, warp, kWarps, c);

  __shared__ float partial[kWarps - 1][32][4];
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp - 1][lane][i] = c[i];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += partial[w][lane][i];
  float row_scale[2] = {1.f, 1.f};
  if constexpr (C == WeightCodec::Nvfp4) {
    row_scale[0] = __ldg(p.weight.row_scales + rows[0]);
    row_scale[1] = __ldg(p.weight.row_scales + rows[1]);
  }
  // columns 2t and 2t + 1: pairs 2t, 2t + 1
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = 2 * t + h;
    if (i >= count) break;
    int pr = pair[0];
#pragma unroll
    for (int m = 1; m < M; ++m)
      if (m == i) pr = pair[m];
    const float lo = c[h] * row_scale[0], hi = c[2 + h] * row_scale[1];
    bf16* out = p.out + static_cast<size_t>(pr) * p.n + j0 + q;
    if constexpr (kSilu) {
      out[0] = __float2bfloat16_rn(lo / (1.f + expf(-lo)) * hi);
    } else {
      out[0] = __float2bfloat16_rn(lo);
      out[8] = __float2bfloat16_rn(hi);
    }
  }
}

// moe_gemv_combine: block b takes output rows j0 = b·R.. of every pair, warp i pair i (expert
// topk_ids[i] from sorted_ids, its input row in[i]), on the walk of moe_gemv_kernel; each pair's
// sums are rounded to bf16 as moe_gemv stores them, then R threads sum over pairs in pair order
// and add the residual as moe_combine_add_rmsnorm does (kernels/moe_combine_device.cuh).
template <WeightCodec C, int R>
__global__ void __launch_bounds__(kMoeGemvCombineMaxPairs * 32) moe_gemv_combine_kernel(MoeGemmParams p, bf16* residual,
                                                                                       const float* weights) {
  __shared__ float ys[kMoeGemvCombineMaxPairs][R], wt[kMoeGemvCombineMaxPairs];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j0 = blockIdx.x * R;
  // The routing is settled (two launches back) but read from L2: this SM's L1 may hold older lines.
  const int e = __ldcg(p.sorted_ids + warp);
  int rows[R];  // rows past n (last block) read row n - 1 and are not stored
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = e * p.n + min(j0 + r, p.n - 1);
  const bf16* xrows[1] = {p.in + static_cast<size_t>(warp) * p.k};
  float acc[R][1];
  gemv_rows<C, 1, R>(p.weight, p.k, rows, xrows, 1, acc);  // waits after its first weight loads
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = warp_sum(acc[r][0]);
    if constexpr (C == WeightCodec::Nvfp4) v *= __ldg(p.weight.row_scales + rows[r]);
    if (lane == 0) ys[warp][r] = __bfloat162float(__float2bfloat16_rn(v));
  }
  // past the wait (in gemv_rows): each warp's pair weight, and the residual rows, requested
  // before the block meets
  if (lane == 0) wt[warp] = weights ? weights[warp] : 1.f;
  const int j = j0 + static_cast<int>(threadIdx.x);
  const bool mine = threadIdx.x < R && j < p.n;
  const float res = mine ? __bfloat162float(residual[j]) : 0.f;
  __syncthreads();
  if (!mine) return;
  float o = 0.f;
  for (int i = 0; i < p.num_pairs; ++i) o = fmaf(wt[i], ys[i][threadIdx.x], o);  // combine8's order
  o = __bfloat162float(__float2bfloat16(o));
  residual[j] = __float2bfloat16(res + o);
}

template <WeightCodec C>
void launch_combine(const MoeGemmParams& p, bf16* residual, const float* weights, cudaStream_t stream) {
  // rows per warp as launch_m picks them for one token's down stage (no second-wave check: the
  // grid here is n / R blocks of num_pairs warps, the same warps as moe_gemv's)
  const int per_lane = CEIL_DIV(p.k / codec_granule(C), 32);
  const int threads = 32 * p.num_pairs;
  if (per_lane >= 8)
    launch_dependent(moe_gemv_combine_kernel<C, 1>, p.n, threads, 0, stream, p, residual, weights);
  else if (per_lane >= 4)
    launch_dependent(moe_gemv_combine_kernel<C, 2>, CEIL_DIV(p.n, 2), threads, 0, stream, p, residual, weights);
  else
    launch_dependent(moe_gemv_combine_kernel<C, 4>, CEIL_DIV(p.n, 4), threads, 0, stream, p, residual, weights);
}

template <int R, bool kSilu>
dim3 gemv_grid(const MoeGemmParams& p) {
  constexpr int kOut = kSilu ? R / 2 : R;
  return dim3(CEIL_DIV(p.n, kWarps * kOut), std::min(p.num_experts, p.num_pairs));
}

// Whether 2R rows per warp fit in one wave where R overflows it (bf16 gate+up at one token:
// 1536 blocks at R = 2, 1188 resident on an H200; 768 at R = 4).
template <WeightCodec C, int M, int R, bool kSilu>
bool second_wave(const MoeGemmParams& p) {
  const auto blocks = [](dim3 g) { return static_cast<int64_t>(g.x) * g.y; };
  return wider_saves_a_wave(moe_gemv_kernel<C, M, R, kSilu>, blocks(gemv_grid<R, kSilu>(p)),
                            moe_gemv_kernel<C, M, 2 * R, kSilu>,
                            blocks(gemv_grid<2 * R, kSilu>(p)), kWarps * 32);
}

template <WeightCodec C, int M, int R, bool kSilu>
void launch(const MoeGemmParams& p, cudaStream_t stream) {
  static_assert(R == 1 || R == 2 || R == 4, "a warp's 8 loads per chunk split over R rows");
  static_assert(!kSilu || R % 2 == 0, "gate and up rows come in pairs");
  static_assert((kSilu ? R / 2 : R) * M <= 32, "one lane stores each output");
  launch_dependent(moe_gemv_kernel<C, M, R, kSilu>, gemv_grid<R, kSilu>(p), kWarps * 32, 0, stream,
                   p);
}

// Rows per warp as the dense GEMV picks them (kernels/quant.cu): a lane's 8 loads per chunk
// should be real granules, more activation rows keep R · M small, and twice the rows per warp
// where that saves a second wave.
template <WeightCodec C, int M, bool kSilu>
void launch_m(const MoeGemmParams& p, cudaStream_t stream) {
  const int per_lane = CEIL_DIV(p.k / codec_granule(C), 32);
  if constexpr (M == 1 && !kSilu) {
    if (per_lane >= 8 && !second_wave<C, M, 1, kSilu>(p)) return launch<C, M, 1, kSilu>(p, stream);
  }
  if constexpr (M <= 4) {
    if (per_lane < 4 || second_wave<C, M, 2, kSilu>(p)) return launch<C, M, 4, kSilu>(p, stream);
  }
  launch<C, M, 2, kSilu>(p, stream);
}

template <WeightCodec C, int M, bool kSilu>
void launch_mma(const MoeGemmParams& p, cudaStream_t stream) {
  const dim3 grid(p.n / (kSilu ? 8 : 16), std::min(p.num_experts, p.num_pairs));
  launch_dependent(moe_gemv_mma_kernel<C, M, kSilu>, grid, kWarps * 32, 0, stream, p);
}

template <WeightCodec C, int M>
void launch_mma_m(const MoeGemmParams& p, cudaStream_t stream) {
  p.silu_gate_up ? launch_mma<C, M, true>(p, stream) : launch_mma<C, M, false>(p, stream);
}

// M: the pairs an expert can have, rounded up to 1, 2, 4 or 8 (fewer kernels; the sentinel
// pairs of an expert's segment are skipped by a warp-uniform branch).
template <WeightCodec C>
void launch_codec(const MoeGemmParams& p, int tokens, cudaStream_t stream) {
  if constexpr (gemv_mma_codec(C)) {
    if (!p.gemv_cuda_cores) {  // any tokens ≤ 8: they are the B columns
      if (tokens <= 1) return launch_mma_m<C, 1>(p, stream);
      if (tokens <= 2) return launch_mma_m<C, 2>(p, stream);
      if (tokens <= 4) return launch_mma_m<C, 4>(p, stream);
      return launch_mma_m<C, 8>(p, stream);
    }
  }
  const bool silu = p.silu_gate_up;
  if (tokens <= 1) return silu ? launch_m<C, 1, true>(p, stream) : launch_m<C, 1, false>(p, stream);
  if (tokens <= 2) return silu ? launch_m<C, 2, true>(p, stream) : launch_m<C, 2, false>(p, stream);
  if (tokens <= 4) return silu ? launch_m<C, 4, true>(p, stream) : launch_m<C, 4, false>(p, stream);
  return silu ? launch_m<C, 8, true>(p, stream) : launch_m<C, 8, false>(p, stream);
}

}  // namespace

bool moe_gemv_combine_takes(const MoeGemmParams& p) {
  return p.direct_topk && p.routing_settled && !p.silu_gate_up && !p.in_fp8 && p.in_row_div == 1 &&
         p.num_pairs >= 1 && p.num_pairs <= kMoeGemvCombineMaxPairs && p.num_pairs <= p.num_experts &&
         aligned16(p.in);
}

void moe_gemv_combine(const MoeGemmParams& p, bf16* residual, const float* weights, cudaStream_t stream) {
  check_moe_gemm_params(p, "moe_gemv_combine");
  MB_CHECK(moe_gemv_combine_takes(p),
           "moe_gemv_combine: needs one token's down stage (direct_topk, routing_settled, no SwiGLU or W8A8, "
           "in_row_div 1) of 1..kMoeGemvCombineMaxPairs pairs and a 16-byte aligned input");
  MB_CHECK(residual != nullptr, "moe_gemv_combine: null residual");
  with_codec(p.weight.codec, [&]<WeightCodec C>() { launch_combine<C>(p, residual, weights, stream); });
  CUDA_CHECK_LAST();
}

void moe_gemv(const MoeGemmParams& p, int tokens, cudaStream_t stream) {
  check_moe_gemm_params(p, "moe_gemv");
  MB_CHECK(tokens >= 1 && tokens <= kMoeGemvMaxTokens,
           "moe_gemv: tokens must be in [1, kMoeGemvMaxTokens]");
  MB_CHECK(p.active_experts != nullptr, "moe_gemv: needs moe_align's active expert list");
  MB_CHECK(!p.direct_topk || (tokens == 1 && p.num_pairs <= p.num_experts),
           "moe_gemv: direct_topk is for one token's pairs");
  if (p.num_pairs == 0) return;
  with_codec(p.weight.codec, [&]<WeightCodec C>() { launch_codec<C>(p, tokens, stream); });
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
