#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_combine_device.cuh"
#include "kernels/moe_ops.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kThreads = 256;

// One thread per 8 outputs, grid-stride over rows * inter / 8.
__global__ void silu_mul_kernel(bf16* out, const bf16* in, int rows, int inter) {
  pdl_sync();
  const int vec_per_row = inter / 8;
  const size_t total = static_cast<size_t>(rows) * vec_per_row;  // size_t: rows*inter overflows int
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = v / vec_per_row;
    const int c = static_cast<int>(v % vec_per_row) * 8;
    float g[8], u[8];
    load8(in + r * 2 * inter + c, g);
    load8(in + r * 2 * inter + inter + c, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = g[j] / (1.f + expf(-g[j])) * u[j];
    store8(out + r * inter + c, g);
  }
}

// One thread per 8 elements, grid-stride over rows * cols / 8.
__global__ void sigmoid_gate_mul_kernel(bf16* x, const bf16* gate, int64_t gate_stride, int rows,
                                        int cols) {
  pdl_sync();
  const int vec_per_row = cols / 8;
  const size_t total = static_cast<size_t>(rows) * vec_per_row;
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = v / vec_per_row;
    const int c = static_cast<int>(v % vec_per_row) * 8;
    float a[8], g[8];
    load8(x + r * cols + c, a);
    load8(gate + r * gate_stride + c, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = a[j] / (1.f + expf(-g[j]));
    store8(x + r * cols + c, a);
  }
}

template <bool kMasked, int kBatch>
__global__ void moe_combine_kernel(MoeCombineParams p) {
  pdl_sync();
  const int vec_per_row = p.hidden / 8;
  const size_t total = static_cast<size_t>(p.tokens) * vec_per_row;
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = v / vec_per_row;
    const int c = static_cast<int>(v % vec_per_row) * 8;
    float acc[8];
    combine8<kMasked, kBatch>(p, t, c, acc);
    store8(p.out + t * p.hidden + c, acc);
  }
}

// One block per token: each thread's vectors of the combined row (rounded to bf16 as moe_combine
// stores them) added into the residual, the sum of squares, then the normalized row. Few tokens
// (decode: this kernel is on the critical path of every layer): a thread's first kHeld vectors
// stay in registers between the two passes, and their norm weights, which are constants, are
// loaded before the wait for the kernel before; other vectors re-read the thread's own residual
// writes, as rmsnorm_kernel does.
template <bool kMasked>
__global__ void __launch_bounds__(kThreads) moe_combine_add_rmsnorm_kernel(MoeCombineParams c,
                                                                           RmsNormParams n) {
  constexpr int kHeld = 2;  // hidden ≤ 2 · 8 · kThreads held whole
  __shared__ float scratch[32];
  const size_t t = blockIdx.x;
  const int nvec = c.hidden / 8, tid = static_cast<int>(threadIdx.x);
  float wt[kHeld][8];
#pragma unroll
  for (int h = 0; h < kHeld; ++h)
    if (tid + h * kThreads < nvec) load8(n.weight + 8 * (tid + h * kThreads), wt[h]);
  pdl_sync();
  bf16* res = n.residual + t * c.hidden;
  float ss = 0.f;
  const auto add = [&](int i, float r[8]) {  // r = bf16(residual + bf16(combined)), stored back
    combine_add8<kMasked, kCombineBatch>(c, t, 8 * i, res + 8 * i, r, ss);
    if (c.top_k > 0) store8(res + 8 * i, r);  // top_k 0: the residual already is the sum
  };
  float held[kHeld][8];
#pragma unroll
  for (int h = 0; h < kHeld; ++h)
    if (tid + h * kThreads < nvec) add(tid + h * kThreads, held[h]);
  for (int i = tid + kHeld * kThreads; i < nvec; i += kThreads) {
    float r[8];
    add(i, r);
  }
  ss = block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / c.hidden + n.eps);
  const auto normalize = [&](int i, float r[8], const float w[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = r[k] * rstd * (n.weight_offset + w[k]);
    store8(n.out + t * c.hidden + 8 * i, r);
  };
#pragma unroll
  for (int h = 0; h < kHeld; ++h)
    if (tid + h * kThreads < nvec) normalize(tid + h * kThreads, held[h], wt[h]);
  for (int i = tid + kHeld * kThreads; i < nvec; i += kThreads) {
    float r[8], w[8];
    load8(res + 8 * i, r);
    load8(n.weight + 8 * i, w);
    normalize(i, r, w);
  }
}

// ≤ 48 registers: five 256-thread blocks an SM (and their 5 × 33 KB of shared memory)
constexpr int kManyMinBlocks = 5;

// 8 floats, each already a bf16 value, as the 16 bytes store8 writes (exact).
__device__ __forceinline__ uint4 pack8(const float in[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return u;
}

// The same for many tokens (prefill), the same sums in the same order (bit for bit), laid out
// for bytes in flight: the kernel streams top_k expert rows per token and is bound by HBM. The
// form above holds a batch's pairs and rows in registers (128 registers: two blocks an SM); its
// per-pair loop (kBatch 1) keeps one 16-byte row load a thread in flight, ≤ 20 KB an SM. Here the
// token's pairs (row, weight) are staged once in shared memory, and a thread's rows of each batch
// of kCombineBatch pairs go by cp.async into its own shared-memory slots: 8 × 16 bytes in flight
// a thread at ≤ 48 registers, five blocks an SM — up to 160 KB of rows in flight an SM, against
// the ~25-30 KB that HBM's latency × bandwidth asks for. The residual load goes out beside the
// row copies; a thread's first kHeld vectors of the new residual stay in registers, as the bf16
// values they are, so the second pass re-reads nothing (at hidden ≤ 2048); the norm weights are
// loaded under the reduction's barriers.
// Shared memory: stage [min(top_k, kCombineBatch)][kThreads] uint4, then pairs [top_k rounded up
// to kCombineBatch].
template <bool kMasked>
__global__ void __launch_bounds__(kThreads, kManyMinBlocks) moe_combine_add_rmsnorm_many_kernel(MoeCombineParams c,
                                                                                                RmsNormParams n) {
  constexpr int kHeld = 1;  // hidden ≤ 8 · kThreads held whole; wider rows re-read the rest
  extern __shared__ uint4 smem[];
  __shared__ float scratch[32];
  const size_t t = blockIdx.x;
  const int nvec = c.hidden / 8, tid = static_cast<int>(threadIdx.x);
  uint4* stage = smem + tid;
  CombinePair* pairs = reinterpret_cast<CombinePair*>(smem + min(c.top_k, kCombineBatch) * kThreads);
  uint4 held[kHeld];
  pdl_sync();
  bf16* res = n.residual + t * c.hidden;
#pragma unroll 1  // one trip while top_k ≤ kThreads
  for (int j = tid; j < CEIL_DIV(c.top_k, kCombineBatch) * kCombineBatch; j += kThreads)
    pairs[j] = j < c.top_k ? combine_pair<kMasked>(c, t * c.top_k + j) : CombinePair{-1, 1.f};
  __syncthreads();
  float ss = 0.f;
  const auto add = [&](int i, float r[8]) {  // r: the residual in, bf16(residual + bf16(combined)) out
    float acc[8];
    combine8_staged(c, pairs, 8 * i, stage, kThreads, acc);
    combine_round_add8(acc, r, ss);
  };
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int i = tid + h * kThreads;
    if (i >= nvec) continue;
    float r[8];
    load8(res + 8 * i, r);  // in flight beside the combine's row copies
    add(i, r);
    held[h] = pack8(r);
    if (c.top_k > 0) *reinterpret_cast<uint4*>(res + 8 * i) = held[h];  // top_k 0: already the sum
  }
  for (int i = tid + kHeld * kThreads; i < nvec; i += kThreads) {
    float r[8];
    load8(res + 8 * i, r);
    add(i, r);
    if (c.top_k > 0) store8(res + 8 * i, r);
  }
  uint4 wt[kHeld];
#pragma unroll
  for (int h = 0; h < kHeld; ++h)
    if (tid + h * kThreads < nvec) wt[h] = *reinterpret_cast<const uint4*>(n.weight + 8 * (tid + h * kThreads));
  ss = block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / c.hidden + n.eps);
  const auto normalize = [&](int i, float r[8], const float w[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = r[k] * rstd * (n.weight_offset + w[k]);
    store8(n.out + t * c.hidden + 8 * i, r);
  };
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int i = tid + h * kThreads;
    if (i >= nvec) continue;
    float r[8], w[8];
    unpack8(held[h], r);
    unpack8(wt[h], w);
    normalize(i, r, w);
  }
  for (int i = tid + kHeld * kThreads; i < nvec; i += kThreads) {
    float r[8], w[8];
    load8(res + 8 * i, r);
    load8(n.weight + 8 * i, w);
    normalize(i, r, w);
  }
}

// One block per token: the gate dot product, then the gated add.
__global__ void __launch_bounds__(kThreads) shared_expert_gate_kernel(SharedExpertGateParams p) {
  pdl_sync();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * p.hidden;
  const int nvec = p.hidden / 8;
  float dot = 0.f;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    float x[8], w[8];
    load8(p.x + base + 8 * i, x);
    load8(p.gate_weight + 8 * i, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) dot += x[j] * w[j];
  }
  dot = block_sum(dot, scratch);
  const float gate = 1.f / (1.f + expf(-dot));
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    float m[8], s[8];
    load8(p.moe_out + base + 8 * i, m);
    load8(p.shared_out + base + 8 * i, s);
#pragma unroll
    for (int j = 0; j < 8; ++j) m[j] += gate * s[j];
    store8(p.out + base + 8 * i, m);
  }
}

int grid_for(size_t vectors) {
  const size_t blocks = CEIL_DIV(vectors, static_cast<size_t>(kThreads));
  return static_cast<int>(blocks < 65536 ? blocks : 65536);  // grid-stride covers the rest
}

}  // namespace

void silu_mul(bf16* out, const bf16* in, int rows, int inter, cudaStream_t stream) {
  MB_CHECK(inter > 0 && inter % 8 == 0 && rows >= 0, "silu_mul: inter must be a positive multiple of 8");
  if (rows == 0) return;
  launch_dependent(silu_mul_kernel, grid_for(static_cast<size_t>(rows) * inter / 8), kThreads, 0,
                   stream, out, in, rows, inter);
  CUDA_CHECK_LAST();
}

void sigmoid_gate_mul(bf16* x, const bf16* gate, int64_t gate_stride, int rows, int cols,
                      cudaStream_t stream) {
  MB_CHECK(cols > 0 && cols % 8 == 0 && rows >= 0 && gate_stride % 8 == 0,
           "sigmoid_gate_mul: cols and gate_stride must be multiples of 8");
  MB_CHECK(x && gate, "sigmoid_gate_mul: null operand");
  if (rows == 0) return;
  launch_dependent(sigmoid_gate_mul_kernel, grid_for(static_cast<size_t>(rows) * cols / 8),
                   kThreads, 0, stream, x, gate, gate_stride, rows, cols);
  CUDA_CHECK_LAST();
}

void moe_combine(bf16* out, const bf16* expert_out, const float* weights, int tokens, int top_k,
                 int hidden, cudaStream_t stream) {
  MoeCombineParams p;
  p.out = out;
  p.expert_out = expert_out;
  p.weights = weights;
  p.tokens = tokens;
  p.top_k = top_k;
  p.hidden = hidden;
  moe_combine(p, stream);
}

void moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  MB_CHECK(p.hidden > 0 && p.hidden % 8 == 0 && p.top_k > 0 && p.tokens >= 0, "moe_combine: bad shape");
  MB_CHECK(p.out && p.expert_out, "moe_combine: null operand");
  MB_CHECK(!p.topk_ids || (p.expert0 >= 0 && p.num_local > 0), "moe_combine: bad expert range");
  if (p.tokens == 0) return;
  const int grid = grid_for(static_cast<size_t>(p.tokens) * p.hidden / 8);
  const bool few = p.tokens <= kCombineBatchMaxTokens;
  const auto kernel = p.topk_ids ? (few ? moe_combine_kernel<true, kCombineBatch> : moe_combine_kernel<true, 1>)
                                 : (few ? moe_combine_kernel<false, kCombineBatch> : moe_combine_kernel<false, 1>);
  launch_dependent(kernel, grid, kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

void moe_combine_add_rmsnorm(const MoeCombineParams& c, const RmsNormParams& n,
                             cudaStream_t stream) {
  MB_CHECK(c.hidden > 0 && c.hidden % 8 == 0 && c.top_k >= 0 && c.tokens >= 0,
           "moe_combine_add_rmsnorm: bad shape");
  MB_CHECK(n.rows == c.tokens && n.cols == c.hidden, "moe_combine_add_rmsnorm: norm shape differs");
  MB_CHECK((c.expert_out || c.top_k == 0) && n.residual && n.out && n.weight,
           "moe_combine_add_rmsnorm: null operand");
  MB_CHECK(n.out != n.residual, "moe_combine_add_rmsnorm: out may not alias the residual");
  MB_CHECK(!c.topk_ids || (c.expert0 >= 0 && c.num_local > 0),
           "moe_combine_add_rmsnorm: bad expert range");
  if (c.tokens == 0) return;
  if (c.tokens <= kCombineBatchMaxTokens) {
    const auto kernel = c.topk_ids ? moe_combine_add_rmsnorm_kernel<true> : moe_combine_add_rmsnorm_kernel<false>;
    launch_dependent(kernel, c.tokens, kThreads, 0, stream, c, n);
  } else {
    const auto kernel =
        c.topk_ids ? moe_combine_add_rmsnorm_many_kernel<true> : moe_combine_add_rmsnorm_many_kernel<false>;
    const size_t smem = static_cast<size_t>(std::min(c.top_k, kCombineBatch)) * kThreads * sizeof(uint4) +
                        static_cast<size_t>(CEIL_DIV(c.top_k, kCombineBatch)) * kCombineBatch * sizeof(CombinePair);
    // past 48 KB from top_k 769 (the stage stays 32 KB); the whole carveout as shared memory so
    // that kManyMinBlocks blocks fit. Set per launch: attributes are per device.
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    launch_dependent(kernel, c.tokens, kThreads, smem, stream, c, n);
  }
  CUDA_CHECK_LAST();
}

void shared_expert_gate(const SharedExpertGateParams& p, cudaStream_t stream) {
  MB_CHECK(p.hidden > 0 && p.hidden % 8 == 0 && p.tokens >= 0, "shared_expert_gate: bad shape");
  MB_CHECK(p.out && p.moe_out && p.shared_out && p.x && p.gate_weight, "shared_expert_gate: null operand");
  if (p.tokens == 0) return;
  launch_dependent(shared_expert_gate_kernel, p.tokens, kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
