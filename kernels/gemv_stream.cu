// The persistent dense decode GEMV (kernels/gemv_stream.cuh): bf16 W [n, k], 1–8 activation rows.
//
// Grid: one CTA per SM, or as many as occupancy allows (computed on the host), at most n. CTA c
// owns rows [c·n/G, (c+1)·n/G) of W: contiguous bytes. They move through a ring of kStages slots
// of `stage_rows` whole rows each (≤ 32 KB; fewer rows when x leaves less shared memory), the
// last stage partial. Shared memory: the barriers (128 bytes), the ring, then x [m, k] bf16.
//
// The producer (lane 0 of the last warp) issues one cp.async.bulk per stage onto the slot's full
// barrier after announcing its bytes (expect_tx). The first kStages stages go out at once, before
// anything waits for the kernel before (weights are constants: launched dependent, the kernel
// streams them while its predecessor finishes); later stages go out as soon as the slot's empty
// barrier says every consumer thread is done with it. The producer never calls pdl_sync: it
// reads nothing an earlier kernel wrote and writes no global memory; the consumers call it.
//
// The consumers (warps 0-7) call pdl_sync, copy x into shared memory once (cp.async), meet at a
// named barrier, then take every stage in order: wait full, multiply their row groups, arrive on
// empty (one arrival per thread). A stage's rows form groups of R (1 at m = 1, 2 at m = 2, 4
// above: the R rows share each x load and its conversion); group j of the CTA, counted across
// stages, goes to warp j % 8, so when a stage holds fewer groups than warps (o_proj at m = 1:
// 4 rows of 8 KB) successive stages are multiplied by different warps at the same time. A lane
// walks granules lane, lane + 32, ... of its rows (16 bytes, 8 bf16: consecutive lanes read
// consecutive granules, no bank conflicts), fp32 FMAs, then warp_sum and one store per (row,
// activation row), as gemv_kernel (kernels/quant.cu). Every consumer thread waits on every full
// barrier, also for stages without rows of its own: a parity wait is only sound one phase ahead
// of the barrier, and walking every stage in order keeps it so.
//
// Built for sm_90a only (MOEBATCH_WGMMA, set by kernels/CMakeLists.txt); without it the entry
// points exist and gemv_stream_available says false.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/quant.cuh"
#if MOEBATCH_WGMMA
#include "kernels/device_common.cuh"
#include "kernels/gemv_device.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_combine_device.cuh"
#include "kernels/stream_ring.cuh"
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

// The kernel's operands (the host fills them in gemv_stream_impl and the entry points; declared
// in every build, as those are).
struct GemvStreamArgs {
  void* out = nullptr;  // [m, n] bf16 or f32
  bool out_f32 = false;
  const bf16* x = nullptr;  // [m, k]
  const bf16* w = nullptr;  // [n, k]
  int n = 0, k = 0;
  int stage_rows = 0;  // rows per ring slot
  // gemv_stream_combine_norm only: x formed from these instead of read
  MoeCombineParams combine = {};
  RmsNormParams norm = {};
  unsigned* counter = nullptr;
  bool trigger_early = false;  // pdl_trigger_early at the start (gemv_stream's argument)
};

#if MOEBATCH_WGMMA

constexpr int kStages = 4;
constexpr int kStageBytes = 32 << 10;  // at most, when a row is shorter
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kBarrierBytes = kStreamRingBarrierBytes;  // full[kStages], empty[kStages]
// The combine-norm prologue's scratch (kConsumerWarps partial sums and the last-CTA flag) sits
// after the barriers, in the dynamic block: static __shared__ would add to the opt-in maximum
// that gemv_stream_prepare sets for the dynamic block, and the launch would fail.
constexpr int kScratchOffset = 16 * kStages;
static_assert(kScratchOffset + 4 * (kConsumerWarps + 1) <= kBarrierBytes,
              "the combine-norm scratch fits between the barriers and the ring");

using Ring = StreamRing<kStages, kConsumerThreads>;  // kernels/stream_ring.cuh

// Consumers: copy `granules` 16-byte granules of global `src` to shared `dst` (cp.async), then
// meet on named barrier 1 (consumers only; the producer never joins).
__device__ __forceinline__ void stream_load_x(uint4* dst, const bf16* src, int granules) {
  for (int j = threadIdx.x; j < granules; j += kConsumerThreads)
    cp_async16(dst + j, src + static_cast<size_t>(j) * 8, 16);
  cp_async_commit();
  cp_async_wait<0>();
  named_barrier_sync<1, kConsumerThreads>();
}

// The first of a stage's groups that goes to `warp` when group j of the CTA (counted over all its
// stages, `before` in earlier ones) goes to warp j % kConsumerWarps: so when a stage holds fewer
// groups than warps, successive stages are multiplied by different warps at the same time.
__device__ __forceinline__ int stream_first_group(int warp, int before) {
  return (warp - before % kConsumerWarps + kConsumerWarps) % kConsumerWarps;
}

// Consumers of gemv_stream_combine_norm: xs = rmsnorm(residual + bf16(combine)) of the one token,
// as moe_combine_add_rmsnorm_kernel computes it (its held-vector form: a thread's ≤ kHeld
// vectors stay in registers between the passes), then the residual write-back by the last CTA.
// `scratch`: kConsumerWarps + 1 words of shared memory. Ends with the consumers met on named
// barrier 1, xs complete.
__device__ __forceinline__ void stream_combine_norm_x(const GemvStreamArgs& a, bf16* xs, int granules,
                                                      float* scratch) {
  constexpr int kHeld = kGemvCombineNormMaxK / 8 / kConsumerThreads;
  float* partial = scratch;                                                  // [kConsumerWarps]
  unsigned& last = *reinterpret_cast<unsigned*>(scratch + kConsumerWarps);  // this CTA took the last ticket
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
  float r[kHeld][8];
  float ss = 0.f;
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int v = tid + h * kConsumerThreads;
    if (v >= granules) continue;
    combine_add8<false, kCombineBatch>(a.combine, 0, 8 * v, a.norm.residual + 8 * v, r[h], ss);
  }
  ss = warp_sum(ss);
  if ((tid & 31) == 0) partial[warp] = ss;
  named_barrier_sync<1, kConsumerThreads>();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < kConsumerWarps; ++i) total += partial[i];
  const float rstd = rsqrtf(total / a.k + a.norm.eps);
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int v = tid + h * kConsumerThreads;
    if (v >= granules) continue;
    float w[8], x[8];
    load8(a.norm.weight + 8 * v, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = r[h][j] * rstd * (a.norm.weight_offset + w[j]);
    store8(xs + 8 * v, x);
  }
  // Every consumer has read its residual vectors (their sums are in r): this CTA's ticket. The
  // last CTA to take one writes the residual back; no CTA reads it after its ticket. With no
  // expert rows (top_k 0: the residual already holds the sum) there is nothing to write back.
  const bool write_back = a.combine.top_k > 0;
  if (tid == 0 && write_back) {
    __threadfence();
    last = atomicAdd(a.counter, 1u) == gridDim.x - 1 ? 1u : 0u;
    if (last) {
      *a.counter = 0;  // every CTA has its ticket: zero again for the next launch
      __threadfence();
    }
  }
  named_barrier_sync<1, kConsumerThreads>();
  if (write_back && last) {
#pragma unroll
    for (int h = 0; h < kHeld; ++h) {
      const int v = tid + h * kConsumerThreads;
      if (v < granules) store8(a.norm.residual + 8 * v, r[h]);
    }
  }
}

// Weight rows a warp multiplies at once for M activation rows.
__host__ __device__ constexpr int stream_rows_per_warp(int m) {
  return m == 1 ? 1 : m == 2 ? 2 : 4;
}

// acc[r][i] = this lane's share of Σ_k w[r][k] · x[i][k] over granules lane, lane + 32, ... of
// `granules`; w rows and x rows (stride `granules`) in shared memory.
template <int M, int R>
__device__ __forceinline__ void stream_rows(const uint4* const (&w)[R], const uint4* x,
                                            int granules, float (&acc)[R][M]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.f;
#pragma unroll 2
  for (int g = threadIdx.x & 31; g < granules; g += 32) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 v = w[r][g];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = bf16x2_to_float2(word_of(v, q));
        wf[r][2 * q] = f.x;
        wf[r][2 * q + 1] = f.y;
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const uint4 xv = x[static_cast<size_t>(i) * granules + g];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 xq = bf16x2_to_float2(word_of(xv, q));
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r][i] = fmaf(wf[r][2 * q + 1], xq.y, fmaf(wf[r][2 * q], xq.x, acc[r][i]));
      }
    }
  }
}

// kCombineNorm (M = 1): x formed by stream_combine_norm_x instead of read
// (gemv_stream_combine_norm).
template <int M, bool kCombineNorm = false>
__global__ void __launch_bounds__(kThreads, 1) gemv_stream_kernel(GemvStreamArgs a) {
  if (a.trigger_early) pdl_trigger_early();
  constexpr int R = stream_rows_per_warp(M);
  extern __shared__ __align__(128) uint8_t gemv_stream_smem[];
  const int granules = a.k / 8;               // per row
  const uint32_t row_bytes = 16u * granules;  // a multiple of 16
  const uint32_t stage_bytes = a.stage_rows * row_bytes;
  uint8_t* ring = gemv_stream_smem + kBarrierBytes;
  uint4* xs = reinterpret_cast<uint4*>(ring + kStages * stage_bytes);  // [M, granules]

  const int row0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * a.n / gridDim.x);
  const int rows = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * a.n / gridDim.x) - row0;
  const int stages = CEIL_DIV(rows, a.stage_rows);  // ≥ 1: the host keeps G ≤ n
  const Ring rg = Ring::init(gemv_stream_smem, stage_bytes);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == kConsumerWarps) {  // producer
    if (lane == 0) {
      const uint8_t* src =
          reinterpret_cast<const uint8_t*>(a.w) + static_cast<size_t>(row0) * row_bytes;
      for (int q = 0; q < stages; ++q) {
        rg.acquire(q);
        const uint32_t bytes = min(a.stage_rows, rows - q * a.stage_rows) * row_bytes;
        wgmma::mbarrier_arrive_expect_tx(rg.full(q), bytes);
        rg.copy(q, rg.slot(q), src + static_cast<size_t>(q) * stage_bytes, bytes);
      }
    }
    return;
  }

  // Consumers. x is the kernel before's output: only now wait for it.
  pdl_sync();
  if constexpr (kCombineNorm)
    stream_combine_norm_x(a, reinterpret_cast<bf16*>(xs), granules,
                          reinterpret_cast<float*>(gemv_stream_smem + kScratchOffset));
  else
    stream_load_x(xs, a.x, M * granules);

  const int groups_per_stage = CEIL_DIV(a.stage_rows, R);
  for (int q = 0; q < stages; ++q) {
    rg.wait_full(q);
    const int first = q * a.stage_rows;  // the stage's first row in the CTA's range
    const int stage_rows = min(a.stage_rows, rows - first);
    const int groups = CEIL_DIV(stage_rows, R);
    const uint8_t* stage = ring + (q % kStages) * stage_bytes;
    for (int j = stream_first_group(warp, q * groups_per_stage); j < groups;
         j += kConsumerWarps) {                   // warp-uniform
      const int nr = min(R, stage_rows - j * R);  // rows of a partial last group
      const uint4* w[R];  // rows past the group's end repeat its last row and are not stored
#pragma unroll
      for (int r = 0; r < R; ++r)
        w[r] = reinterpret_cast<const uint4*>(stage + (j * R + min(r, nr - 1)) * row_bytes);
      float acc[R][M];
      stream_rows<M, R>(w, xs, granules, acc);
      // R · M ≤ 32 sums; lane r · M + i stores sum (r, i)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = row0 + first + j * R + r;
#pragma unroll
        for (int i = 0; i < M; ++i) {
          const float v = warp_sum(acc[r][i]);
          if (lane == r * M + i && r < nr) {
            const size_t o = static_cast<size_t>(i) * a.n + row;
            if (a.out_f32)
              static_cast<float*>(a.out)[o] = v;
            else
              static_cast<bf16*>(a.out)[o] = __float2bfloat16_rn(v);
          }
        }
      }
    }
    rg.release(q);
  }
}

using GemvStreamKernel = void (*)(GemvStreamArgs);
constexpr GemvStreamKernel kKernels[kGemvMaxRows] = {
    gemv_stream_kernel<1>, gemv_stream_kernel<2>, gemv_stream_kernel<3>, gemv_stream_kernel<4>,
    gemv_stream_kernel<5>, gemv_stream_kernel<6>, gemv_stream_kernel<7>, gemv_stream_kernel<8>};
static_assert(stream_rows_per_warp(kGemvMaxRows) * kGemvMaxRows <= 32,
              "one lane stores each (row, activation row) sum");
static_assert(kGemvCombineNormMaxK % (8 * kConsumerThreads) == 0, "whole vectors per consumer thread");

// The ring's shape on `device` for units of `unit_bytes` (whole rows) beside `x_bytes` of
// resident input: units per slot, up to kStageBytes, fewer when x leaves less room for four
// slots; 0 when not even four one-unit slots fit. `smem` gets the kernel's dynamic shared memory.
int64_t stream_slot_units(int device, int64_t unit_bytes, int64_t x_bytes, size_t* smem) {
  const int64_t room = stream_smem_optin(device) - kBarrierBytes - x_bytes;
  const int64_t units = std::min<int64_t>(std::max<int64_t>(1, kStageBytes / unit_bytes),
                                          room / (kStages * unit_bytes));
  if (room <= 0 || units < 1) return 0;
  if (smem) *smem = static_cast<size_t>(kBarrierBytes + kStages * units * unit_bytes + x_bytes);
  return units;
}

// CTAs of `kernel` with `smem` bytes that run at once on `device` (one wave), at most `cap`.
template <typename Args>
int stream_grid(void (*kernel)(Args), int device, size_t smem, int64_t cap, const char* op) {
  int sms = 0, per_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  MB_CHECK(per_sm >= 1,
           std::string(op) + ": no CTA fits (call gemv_stream_prepare on this device first)");
  return static_cast<int>(std::min<int64_t>(cap, static_cast<int64_t>(sms) * per_sm));
}

#endif  // MOEBATCH_WGMMA

// a.x — or, for gemv_stream_combine_norm, a.combine, a.norm and a.counter — as the caller set
// them; the rest here.
void gemv_stream_impl(GemvStreamArgs a, void* out, bool out_f32, const bf16* w, int m, int n, int k,
                      cudaStream_t stream) {
  const bool combine_norm = a.counter != nullptr;
  MB_CHECK(m >= 0 && m <= kGemvMaxRows && n > 0 && k > 0,
           "gemv_stream: bad shape (m <= kGemvMaxRows)");
  MB_CHECK(k % 8 == 0, "gemv_stream: k must be a multiple of 8 (rows of 16-byte granules)");
  MB_CHECK(out && (a.x || combine_norm) && w, "gemv_stream: null operand");
  MB_CHECK((combine_norm || aligned16(a.x)) && aligned16(w), "gemv_stream: x and W must be 16-byte aligned");
  if (m == 0) return;
#if MOEBATCH_WGMMA
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t row_bytes = 2 * static_cast<int64_t>(k);
  size_t smem = 0;
  const int64_t stage_rows = stream_slot_units(device, row_bytes, m * row_bytes, &smem);
  MB_CHECK(stage_rows >= 1,
           "gemv_stream: m * k too large (x and four stages of one row must fit in shared memory)");
  const GemvStreamKernel kernel = combine_norm ? gemv_stream_kernel<1, true> : kKernels[m - 1];
  const int grid = stream_grid(kernel, device, smem, n, "gemv_stream");
  a.out = out;
  a.out_f32 = out_f32;
  a.w = w;
  a.n = n;
  a.k = k;
  a.stage_rows = static_cast<int>(stage_rows);
  launch_dependent(kernel, grid, kThreads, smem, stream, a);
  CUDA_CHECK_LAST();
#else
  (void)a;
  (void)out_f32;
  (void)stream;
  MB_CHECK(false, "gemv_stream: this build has no sm_90a code (see gemv_stream_available)");
#endif
}

}  // namespace

// The same condition as the wgmma kernels': this build's sm_90a object (MOEBATCH_WGMMA) and a
// compute capability 9.0 device.
bool gemv_stream_available(int device) { return moe_wgmma_available(device); }

bool gemv_stream_fits(int m, int k) {
#if MOEBATCH_WGMMA
  if (m < 1 || m > kGemvMaxRows || k <= 0 || k % 8 != 0) return false;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t row_bytes = 2 * static_cast<int64_t>(k);
  return stream_slot_units(device, row_bytes, m * row_bytes, nullptr) >= 1;
#else
  (void)m;
  (void)k;
  return false;
#endif
}

void gemv_stream_prepare() {
#if MOEBATCH_WGMMA
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int bytes = stream_smem_optin(device);
  for (GemvStreamKernel kernel : kKernels)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  CUDA_CHECK(cudaFuncSetAttribute(gemv_stream_kernel<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
#endif
}

void gemv_stream(bf16* out, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream,
                 bool trigger_early) {
  GemvStreamArgs a;
  a.x = x;
  a.trigger_early = trigger_early;
  gemv_stream_impl(a, out, false, w, m, n, k, stream);
}

void gemv_stream(float* out, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream,
                 bool trigger_early) {
  GemvStreamArgs a;
  a.x = x;
  a.trigger_early = trigger_early;
  gemv_stream_impl(a, out, true, w, m, n, k, stream);
}

bool gemv_stream_combine_norm_fits(int k) {
  return k <= kGemvCombineNormMaxK && gemv_stream_fits(1, k);
}

void gemv_stream_combine_norm(bf16* out, const MoeCombineParams& c, const RmsNormParams& norm,
                              unsigned* counter, const bf16* w, int n, int k, cudaStream_t stream,
                              bool trigger_early) {
  MB_CHECK(k > 0 && k <= kGemvCombineNormMaxK && c.tokens == 1 && c.hidden == k && norm.cols == k &&
               c.top_k >= 0 && c.topk_ids == nullptr,
           "gemv_stream_combine_norm: one token of hidden k <= kGemvCombineNormMaxK, no expert mask");
  MB_CHECK((c.expert_out || c.top_k == 0) && norm.residual && norm.weight && counter,
           "gemv_stream_combine_norm: null operand");
  GemvStreamArgs a;
  a.combine = c;
  a.norm = norm;
  a.counter = counter;
  a.trigger_early = trigger_early;
  gemv_stream_impl(a, out, false, w, 1, n, k, stream);
}

}  // namespace moebatch::kernels
