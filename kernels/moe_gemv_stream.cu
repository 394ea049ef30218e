// The one-token expert GEMV as a persistent stream (kernels/moe_gemv_stream.cuh).
//
// Work: the token's num_pairs experts × n outputs as 16-row tiles (SwiGLU: gate rows j0 .. j0 + 7
// and their up rows n + j0 ..; else rows j0 .. j0 + 15), pair-major; CTA c of G takes tiles
// [c·T/G, (c+1)·T/G). A tile is one stage of the ring (kernels/stream_ring.cuh): two 8-row halves,
// each half's codes then its scales (and Int4 mins) — 4 or 6 bulk copies, every one contiguous in
// the stacked tensor. The producer (lane 0 of the last warp) reads each tile's expert from
// topk_ids — after pdl_sync unless the routing is settled (down: written two launches back) — and
// keeps kStages tiles in flight. Every consumer warp takes every eighth granule quad of each tile
// (mma_granule, kernels/gemv_mma_device.cuh, its words read from the slot), the warps' column-0
// sums meet in shared memory (double-buffered: one named barrier a tile, summed in warp order),
// and 8 or 16 threads store the tile's outputs (SwiGLU, the Nvfp4 row scale) while the others go
// on to the next tile.
//
// Built for sm_90a only (MOEBATCH_WGMMA); without it moe_gemv_stream_takes says false.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.cuh"
#include "kernels/moe_gemv_stream.cuh"
#include "kernels/moe_wgmma.cuh"
#if MOEBATCH_WGMMA
#include "kernels/gemv_mma_device.cuh"
#include "kernels/launch.cuh"
#include "kernels/stream_ring.cuh"
#endif

namespace moebatch::kernels {
namespace {

// One stage: 16 weight rows as two 8-row halves, each half's codes, then both halves' scales,
// then (Int4) both halves' mins. Byte counts are multiples of 16 for k % 128 == 0 (Fp8Block:
// 32 · k / group, a multiple of 32).
struct TileLayout {
  uint32_t half_bytes = 0;   // codes of 8 rows: 8 · k / 2 (Fp8Block 8 · k)
  uint32_t scale_bytes = 0;  // scales of 8 rows: Nvfp4 8 · k / 16 (E4M3), Int4 8 · k / 32 (f32),
                             // Fp8Block 8 · k / group (f32)
  uint32_t mins_bytes = 0;   // Int4: as scale_bytes; else none
  __host__ __device__ uint32_t codes(int h) const { return h * half_bytes; }
  __host__ __device__ uint32_t scales(int h) const { return 2 * half_bytes + h * scale_bytes; }
  __host__ __device__ uint32_t mins(int h) const { return 2 * (half_bytes + scale_bytes) + h * mins_bytes; }
  __host__ __device__ uint32_t bytes() const { return 2 * (half_bytes + scale_bytes + mins_bytes); }
};

TileLayout tile_layout(const QuantMatrix& w, int k) {
  const WeightCodec c = w.codec;
  TileLayout l;
  l.half_bytes = static_cast<uint32_t>(8 * codec_row_bytes(c, k));
  l.scale_bytes = static_cast<uint32_t>(c == WeightCodec::Nvfp4 ? k / 2 : c == WeightCodec::Int4 ? k : 32 * (k / w.group));
  l.mins_bytes = c == WeightCodec::Int4 ? l.scale_bytes : 0;
  return l;
}

struct StreamArgs {
  MoeGemmParams p;
  TileLayout lay;
  bool dense = false;      // one matrix (gemv_quant_stream): expert 0, no ids to read
  int tiles_per_pair = 0;  // n / 8 (SwiGLU) or n / 16
  int tiles = 0;           // num_pairs · tiles_per_pair
};

#if MOEBATCH_WGMMA

constexpr int kStages = 4;
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
using Ring = StreamRing<kStages, kConsumerThreads>;
// The warps' column-0 sums of a tile, [2 buffers][warp][tile row q][half]: after the ring, in the
// dynamic block (static __shared__ would add to the opt-in maximum moe_gemv_stream_prepare sets).
constexpr int kReduceBytes = 2 * kConsumerWarps * 8 * 2 * 4;

size_t stream_smem(const TileLayout& l) {
  return kStreamRingBarrierBytes + static_cast<size_t>(kStages) * l.bytes() + kReduceBytes;
}

template <WeightCodec C, bool kSilu>
__global__ void __launch_bounds__(kThreads, 1) moe_gemv_stream_kernel(StreamArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const MoeGemmParams& p = a.p;
  const TileLayout& lay = a.lay;
  const int t0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * a.tiles / gridDim.x);
  const int t1 = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * a.tiles / gridDim.x);
  const int n = p.n, k = p.k;
  const int rows_per_expert = kSilu ? 2 * n : n;
  constexpr int kTileOut = kSilu ? 8 : 16;
  const Ring rg = Ring::init(smem, lay.bytes());
  // the first matrix row of half h of tile `tile` (expert e)
  const auto half_row = [&](int e, int tile, int h) {
    const int j0 = (tile % a.tiles_per_pair) * kTileOut;
    return static_cast<size_t>(e) * rows_per_expert + (kSilu ? h * n + j0 : j0 + 8 * h);
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == kConsumerWarps) {  // producer
    if (lane == 0) {
      if (!p.routing_settled) pdl_sync();  // the expert ids are the kernel before's output
      const size_t row_bytes = codec_row_bytes(C, k);
      const size_t scale_row_bytes = lay.scale_bytes / 8;
      for (int q = 0; q < t1 - t0; ++q) {
        const int tile = t0 + q;
        const int e = a.dense ? 0 : __ldcg(p.sorted_ids + tile / a.tiles_per_pair);
        rg.acquire(q);
        wgmma::mbarrier_arrive_expect_tx(rg.full(q), lay.bytes());
        const uint32_t dst = rg.slot(q);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const size_t row = half_row(e, tile, h);
          rg.copy(q, dst + lay.codes(h), static_cast<const uint8_t*>(p.weight.data) + row * row_bytes,
                  lay.half_bytes);
          rg.copy(q, dst + lay.scales(h), static_cast<const uint8_t*>(p.weight.scales) + row * scale_row_bytes,
                  lay.scale_bytes);
          if constexpr (C == WeightCodec::Int4)
            rg.copy(q, dst + lay.mins(h), reinterpret_cast<const uint8_t*>(p.weight.mins) + row * scale_row_bytes,
                    lay.mins_bytes);
        }
      }
    }
    return;
  }

  // Consumers: the activation rows and the outputs are the kernels before's.
  pdl_sync();
  const int qr = lane >> 2, t = lane & 3;  // tile rows qr (half 0) and qr (half 1); granules 4j + t
  constexpr int V = codec_granule(C);  // values a granule (16 bytes)
  const int quads = k / (4 * V);
  const int row_bytes = static_cast<int>(codec_row_bytes(C, k));
  const int blocks = C == WeightCodec::Fp8Block ? k / p.weight.group : 0;  // Fp8Block scales a row
  // A storing thread's output (tid < kTileOut): half oh, tile row orow.
  const int oh = kSilu ? 0 : threadIdx.x / 8, orow = kSilu ? threadIdx.x : threadIdx.x % 8;
  uint8_t* ring = smem + kStreamRingBarrierBytes;
  float(*reduce)[kConsumerWarps][8][2] =
      reinterpret_cast<float(*)[kConsumerWarps][8][2]>(ring + static_cast<size_t>(kStages) * lay.bytes());
  for (int q = 0; q < t1 - t0; ++q) {
    const int tile = t0 + q, pair = tile / a.tiles_per_pair;
    const bf16* x = p.in + static_cast<size_t>(pair / p.in_row_div) * k;
    // NVFP4's row scales of the storing threads' outputs requested now, so the store after the
    // reduction waits on no load.
    float row_scale[2] = {1.f, 1.f};
    if constexpr (C == WeightCodec::Nvfp4) {
      if (threadIdx.x < kTileOut) {
        const int e = a.dense ? 0 : __ldcg(p.sorted_ids + pair);
        row_scale[0] = __ldg(p.weight.row_scales + half_row(e, tile, oh) + orow);
        if constexpr (kSilu) row_scale[1] = __ldg(p.weight.row_scales + half_row(e, tile, 1) + orow);
      }
    }
    rg.wait_full(q);
    const uint8_t* slot = ring + static_cast<size_t>(q % kStages) * lay.bytes();
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = warp; j < quads; j += kConsumerWarps) {  // warp-uniform
      const int g = 4 * j + t;
      uint4 w[2];
      MmaGranuleScales sc;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[h] = *reinterpret_cast<const uint4*>(slot + lay.codes(h) + static_cast<size_t>(qr) * row_bytes + 16 * g);
        if constexpr (C == WeightCodec::Nvfp4) {
          sc.gscale[h] = *reinterpret_cast<const unsigned short*>(slot + lay.scales(h) + qr * (k / 16) + 2 * g);
        } else if constexpr (C == WeightCodec::Fp8Block) {
          const int at = (qr * blocks + g * V / p.weight.group) * 4;
          sc.scale[h] = *reinterpret_cast<const float*>(slot + lay.scales(h) + at);
        } else {
          const size_t at = (static_cast<size_t>(qr) * (k / 32) + g) * 4;
          sc.scale[h] = *reinterpret_cast<const float*>(slot + lay.scales(h) + at);
          sc.minv[h] = *reinterpret_cast<const float*>(slot + lay.mins(h) + at);
        }
      }
      mma_granule<C>(c, w, sc, x + static_cast<size_t>(g) * V);
    }
    rg.release(q);  // this thread has read the slot (its words are in registers)
    // Column 0 of the C fragment (every column holds the one token): lanes t == 0, c[0] of half
    // 0's row qr, c[2] of half 1's.
    float(*red)[8][2] = reduce[q & 1];
    if (t == 0) {
      red[warp][qr][0] = c[0];
      red[warp][qr][1] = c[2];
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
    // Double-buffered: the buffer is written again two tiles on, after every thread has passed
    // the next tile's barrier, so after these reads.
    const int tid = threadIdx.x;
    if (tid < kTileOut) {
      const int j0 = (tile % a.tiles_per_pair) * kTileOut;
      float v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) {
        v0 += red[w][orow][oh];
        if constexpr (kSilu) v1 += red[w][orow][1];
      }
      v0 *= row_scale[0];
      v1 *= row_scale[1];
      const float out = kSilu ? v0 / (1.f + expf(-v0)) * v1 : v0;
      p.out[static_cast<size_t>(pair) * n + j0 + tid] = __float2bfloat16_rn(out);
    }
  }
}

template <WeightCodec C, bool kSilu>
void launch_stream(const StreamArgs& a, cudaStream_t stream, int ctas_per_sm) {
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t smem = stream_smem(a.lay);
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_gemv_stream_kernel<C, kSilu>, kThreads, smem));
  MB_CHECK(per_sm >= 1, "moe_gemv_stream: no CTA fits (call moe_gemv_stream_prepare on this device first)");
  if (ctas_per_sm > 0) per_sm = std::min(per_sm, ctas_per_sm);
  const int grid = static_cast<int>(std::min<int64_t>(a.tiles, static_cast<int64_t>(sms) * per_sm));
  launch_dependent(moe_gemv_stream_kernel<C, kSilu>, grid, kThreads, smem, stream, a);
}

template <WeightCodec C>
void launch_codec(const StreamArgs& a, cudaStream_t stream, int ctas_per_sm) {
  if (a.p.silu_gate_up)
    launch_stream<C, true>(a, stream, ctas_per_sm);
  else
    launch_stream<C, false>(a, stream, ctas_per_sm);
}

#endif  // MOEBATCH_WGMMA

// What both entries need of the weights and the shape (n: outputs, a multiple of the tile's).
bool stream_takes(const QuantMatrix& w, int n, int k, bool silu) {
#if MOEBATCH_WGMMA
  const bool codec = w.codec == WeightCodec::Nvfp4 || (w.codec == WeightCodec::Int4 && w.group == 32 && w.mins) ||
                     (w.codec == WeightCodec::Fp8Block && w.group > 0 && w.group % 16 == 0 && k % w.group == 0);
  if (!codec || k <= 0 || k % 128 != 0 || n <= 0 || n % (silu ? 8 : 16) != 0 || !aligned16(w.data) ||
      !aligned16(w.scales) || (w.mins && !aligned16(w.mins)))
    return false;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return moe_wgmma_available(device) &&
         stream_smem(tile_layout(w, k)) <= static_cast<size_t>(stream_smem_optin(device));
#else
  (void)w, (void)n, (void)k, (void)silu;
  return false;
#endif
}

void launch_any(const StreamArgs& a, cudaStream_t stream, int ctas_per_sm) {
#if MOEBATCH_WGMMA
  switch (a.p.weight.codec) {
    case WeightCodec::Nvfp4: launch_codec<WeightCodec::Nvfp4>(a, stream, ctas_per_sm); break;
    case WeightCodec::Int4: launch_codec<WeightCodec::Int4>(a, stream, ctas_per_sm); break;
    default: launch_codec<WeightCodec::Fp8Block>(a, stream, ctas_per_sm);  // stream_takes
  }
  CUDA_CHECK_LAST();
#else
  (void)a, (void)stream, (void)ctas_per_sm;
#endif
}

}  // namespace

bool moe_gemv_stream_takes(const MoeGemmParams& p) {
  return p.direct_topk && !p.in_fp8 && aligned16(p.in) && stream_takes(p.weight, p.n, p.k, p.silu_gate_up);
}

bool gemv_quant_stream_takes(const QuantMatrix& w, const bf16* in, int n, int k) {
  return aligned16(in) && stream_takes(w, n, k, false);
}

void moe_gemv_stream_prepare() {
#if MOEBATCH_WGMMA
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int bytes = stream_smem_optin(device);
  for (auto kernel : {moe_gemv_stream_kernel<WeightCodec::Nvfp4, true>, moe_gemv_stream_kernel<WeightCodec::Nvfp4, false>,
                      moe_gemv_stream_kernel<WeightCodec::Int4, true>, moe_gemv_stream_kernel<WeightCodec::Int4, false>,
                      moe_gemv_stream_kernel<WeightCodec::Fp8Block, true>, moe_gemv_stream_kernel<WeightCodec::Fp8Block, false>})
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
#endif
}

void moe_gemv_stream(const MoeGemmParams& p, cudaStream_t stream, int ctas_per_sm) {
  check_moe_gemm_params(p, "moe_gemv_stream");
  MB_CHECK(moe_gemv_stream_takes(p),
           "moe_gemv_stream: needs one token's pairs (direct_topk), Nvfp4, Int4 or Fp8Block weights, k % 128 == 0 "
           "and a Hopper GPU with this build's sm_90a code (see moe_gemv_stream_takes)");
  if (p.num_pairs == 0) return;
  StreamArgs a;
  a.p = p;
  a.lay = tile_layout(p.weight, p.k);
  a.tiles_per_pair = p.n / (p.silu_gate_up ? 8 : 16);
  a.tiles = p.num_pairs * a.tiles_per_pair;
  launch_any(a, stream, ctas_per_sm);
}

void gemv_quant_stream(bf16* out, const bf16* in, const QuantMatrix& w, int n, int k, cudaStream_t stream,
                       int ctas_per_sm) {
  check_quant_matrix(w, "gemv_quant_stream");
  MB_CHECK(out && in && gemv_quant_stream_takes(w, in, n, k),
           "gemv_quant_stream: needs Nvfp4, Int4 or Fp8Block weights, n % 16 == 0, k % 128 == 0 and a Hopper GPU "
           "with this build's sm_90a code (see gemv_quant_stream_takes)");
  // The one matrix is expert 0 with one pair; its tiles stream from the first cycle (the weights
  // are constants: routing_settled), the consumers wait for `in`.
  StreamArgs a;
  a.p.out = out;
  a.p.in = in;
  a.p.weight = w;
  a.p.num_pairs = 1;
  a.p.num_experts = 1;
  a.p.n = n;
  a.p.k = k;
  a.p.routing_settled = true;
  a.dense = true;
  a.lay = tile_layout(w, k);
  a.tiles_per_pair = a.tiles = n / 16;
  launch_any(a, stream, ctas_per_sm);
}

}  // namespace moebatch::kernels
