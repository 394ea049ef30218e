// moe_gemm for bf16 experts, and W8A8 experts (FP8 blocks of 128 inputs, e4m3 activations), on
// Hopper (kernels/moe_gemm.cuh, moe_gemm_tma): the weights stream through a shared-memory ring
// filled by TMA, the products run on wgmma, and the CTAs are persistent, so no CTA ever waits
// for its first weight bytes after the first tile.
//
// Why (bench/RESULTS.md, 2026-12-02 / 2026-12-03): at batch 256 on the 30B shape the
// register-pipelined moe_gemm streams gate+up at 83% and down at 74% of copy bandwidth (bf16;
// W8A8 45-50%). Each of its blocks holds at most two 256-input chunks per warp in registers (it
// sits at its 168-register limit), restarts that pipeline for every 64-row slice of an expert,
// and its last wave runs part-empty. Here the bytes in flight live in shared memory (5 stages of
// 16 KB of weights per CTA, two CTAs per SM) and the producer carries on into the next tile while
// the consumers finish the current one: 94% / 87% (bf16), 83% / 73% (W8A8).
//
// Work: a tile is (expert with pairs, row block) — 128 weight rows: for silu_gate_up the 64 gate
// rows and the matching 64 up rows (one thread holds gate and up of the same output), else 128
// consecutive rows — over all of k, applied to the expert's pairs 32 at a time (a pass; an
// expert with more pairs streams the tile once per pass, as moe_gemm does). Tile t of
// (experts × row blocks) goes to CTA t % grid, experts outermost, so the CTAs working at one time
// share an expert's activation rows in L2.
//
// Roles: warps 0-3 (one warpgroup) consume, warp 4 produces. A stage is 128 bytes of every row:
// 64 bf16 or 128 e4m3 inputs (one activation scale group). Per stage the producer waits for the
// slot's empty barrier, lane 0 announces 16 KB and issues two TMA boxes of 64 weight rows × 128
// bytes (128-byte swizzle; rows and inputs past the matrix read as zeros), lane r copies pass row
// r's 128 bytes (cp.async, zeros for padding pairs and past k) into the slot's activation tile in
// the same swizzle, and for W8A8 the stage's 128 weight-row scales and 32 pair scales beside it
// (4-byte cp.async); each lane's cp.async arrival and lane 0's byte count complete the slot's
// full barrier. The consumers wait for it, issue wgmma.m64n32k16 (bf16) or m64n32k32 (e4m3) over
// the two boxes (weights as A: rows on M; the pass's pairs as B: the narrow side carries pairs,
// as in moe_gemm's swapped product), and release the slot once those MMAs are done. W8A8 sums a
// stage into its own accumulators (two sets, alternating) and promotes them, scaled by weight
// row × pair, once the next stage's MMAs are issued. After a pass's last stage: the epilogue
// from the fp32 accumulators, one rounding, SiLU·mul with silu_gate_up.
//
// Built for sm_90a only (MOEBATCH_WGMMA, kernels/CMakeLists.txt); without it the entry points
// exist and moe_gemm_tma_available says false.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda_check.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_wgmma.cuh"
#if MOEBATCH_WGMMA
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/tensor_map.cuh"
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

#if MOEBATCH_WGMMA

constexpr int kBox = 64;        // weight rows per TMA box and per m64 MMA; two boxes per tile
constexpr int kRowBytes = 128;  // bytes of a row per stage: one 128-byte swizzled row
constexpr int kPass = 32;       // pairs per pass: the MMAs' N
constexpr int kStages = 5;      // two CTAs per SM: 10 stages of weights in flight per SM
constexpr int kConsumerThreads = 128;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kBoxBytes = kBox * kRowBytes;      // 8 KB
constexpr int kWeightBytes = 2 * kBoxBytes;
constexpr int kXBytes = kPass * kRowBytes;       // 4 KB
// W8A8: the stage's scales after its tiles: the 128 weight rows', then the 32 pass rows'.
constexpr int kScaleBytes = 1024;
static_assert((2 * kBox + kPass) * 4 <= kScaleBytes, "a stage's scales fit their slot");
constexpr int kCtasPerSm = 2;
static_assert(kWeightBytes % 1024 == 0 && kXBytes % 1024 == 0, "swizzled tiles are 1024-aligned");

// Inputs per stage: 64 bf16 or 128 e4m3 (= the activation scale group, kMoeGemmA8Group).
template <bool kFp8>
constexpr int kBK = kFp8 ? 128 : 64;
template <bool kFp8>
constexpr int kStageBytes = kWeightBytes + kXBytes + (kFp8 ? kScaleBytes : 0);  // multiples of 1024
template <bool kFp8>
constexpr int kSmemBytes = kStages * kStageBytes<kFp8> + 1024;  // + slack to align the base to 1024
static_assert(kBK<true> == kMoeGemmA8Group, "a W8A8 stage is one activation scale group");

// The tile sequence every role of a CTA walks in the same order.
struct TileWalk {
  int row_blocks;  // per expert
  int experts;     // experts with pairs (active list), or every expert
  __device__ int tiles() const { return experts * row_blocks; }
};

struct Tile {
  int expert, row_block, seg_begin, seg_end;
};

__device__ __forceinline__ Tile tile_at(const MoeGemmParams& p, const TileWalk& w, int t) {
  Tile tl;
  const int a = t / w.row_blocks;
  tl.row_block = t % w.row_blocks;
  tl.expert = p.active_experts != nullptr ? p.active_experts[1 + a] : a;
  tl.seg_begin = p.expert_offsets[tl.expert];
  tl.seg_end = p.expert_offsets[tl.expert + 1];
  return tl;
}

// Matrix rows of the tile's two boxes (silu_gate_up: gate rows, then the matching up rows).
__device__ __forceinline__ int box_row(const MoeGemmParams& p, const Tile& t, int box) {
  if (p.silu_gate_up) return t.expert * 2 * p.n + box * p.n + t.row_block * kBox;
  return t.expert * p.n + t.row_block * 2 * kBox + box * kBox;
}

template <bool kFp8>
__device__ __forceinline__ void produce(const MoeGemmParams& p, const TileWalk& walk, const CUtensorMap* map,
                                        uint8_t* smem, uint32_t smem_addr, uint32_t full0, uint32_t empty0) {
  constexpr int BK = kBK<kFp8>, kElem = kFp8 ? 1 : 2;
  const int lane = threadIdx.x & 31, kt_count = (p.k + BK - 1) / BK;
  const uint8_t* in = kFp8 ? p.in_fp8 : reinterpret_cast<const uint8_t*>(p.in);
  const int groups = p.k / BK;  // W8A8: scales per row (k % 128 == 0 there)
  const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * (p.silu_gate_up ? 2 : 1) * p.n;
  const float* w_scales = static_cast<const float*>(p.weight.scales);
  int q = 0;  // stage counter over the CTA's life: slot q % kStages, phase q / kStages
  for (int ti = blockIdx.x; ti < walk.tiles(); ti += gridDim.x) {
    const Tile t = tile_at(p, walk, ti);
    const int rows[2] = {box_row(p, t, 0), box_row(p, t, 1)};
    for (int pass = t.seg_begin; pass < t.seg_end; pass += kPass) {
      int src = -1;  // the activation row lane copies: pass row `lane`
      if (pass + lane < t.seg_end) {
        const int id = p.sorted_ids[pass + lane];
        if (id >= 0 && id < p.num_pairs) src = id / p.in_row_div;
      }
      const uint8_t* src_row = src >= 0 ? in + static_cast<size_t>(src) * p.k * kElem : in;
      for (int kt = 0; kt < kt_count; ++kt, ++q) {
        const int slot = q % kStages;
        if (q >= kStages) wgmma::mbarrier_wait(empty0 + slot * 8, (q / kStages - 1) & 1);
        const uint32_t full = full0 + slot * 8, w_tile = smem_addr + slot * kStageBytes<kFp8>;
        if (lane == 0) {
          wgmma::mbarrier_arrive_expect_tx(full, kWeightBytes);
          wgmma::tma_load_2d(w_tile, map, kt * BK, rows[0], full);
          wgmma::tma_load_2d(w_tile + kBoxBytes, map, kt * BK, rows[1], full);
        }
        uint8_t* x_tile = smem + slot * kStageBytes<kFp8> + kWeightBytes;
#pragma unroll
        for (int c = 0; c < kRowBytes / 16; ++c) {
          const int byte = kt * kRowBytes + c * 16;
          const bool ok = src >= 0 && byte < p.k * kElem;
          cp_async16(x_tile + wgmma::sw128_offset(lane, c), ok ? src_row + byte : in, ok ? 16 : 0);
        }
        if constexpr (kFp8) {
          // the group's scales: weight rows 0-127 of the tile (rows past the matrix: 0), pass rows 0-31
          float* scales = reinterpret_cast<float*>(x_tile + kXBytes);
#pragma unroll
          for (int i = 0; i < 2 * kBox / 32; ++i) {
            const int r = lane + 32 * i, row = rows[r / kBox] + r % kBox;
            const bool ok = row < weight_rows;
            cp_async4(&scales[r], ok ? w_scales + static_cast<size_t>(row) * groups + kt : w_scales, ok ? 4 : 0);
          }
          cp_async4(&scales[2 * kBox + lane], src >= 0 ? p.in_scales + static_cast<size_t>(src) * groups + kt : p.in_scales,
                    src >= 0 ? 4 : 0);
        }
        wgmma::cp_async_mbarrier_arrive(full);
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives its thread
}

// One output value of the epilogue; `pair` < 0: a padding pair, nothing written.
__device__ __forceinline__ void store_out(const MoeGemmParams& p, int pair, int col, float v) {
  if (pair >= 0 && col < p.n) p.out[static_cast<size_t>(pair) * p.n + col] = __float2bfloat16(v);
}

// Accumulators of the two boxes (kernels/wgmma.cuh layout, N = 32): d[4j], d[4j+1] at box row
// 16·warp + lane/4, pairs 8j + 2(lane%4) + {0, 1} of the pass; d[4j+2], d[4j+3] at box row + 8.
using BoxAcc = float[2][16];

__device__ __forceinline__ void fence_acc(BoxAcc& a) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    wgmma::fence_operand(a[0][i]);
    wgmma::fence_operand(a[1][i]);
  }
}

// The MMAs of one stage into d (accumulating onto it from input `acc_from` on).
template <bool kFp8>
__device__ __forceinline__ void stage_mma(BoxAcc& d, uint32_t w_tile, bool accumulate) {
  const uint32_t x_tile = w_tile + kWeightBytes;
  fence_acc(d);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {  // four 32-byte k slices of the 128-byte rows
    const int acc = accumulate || kk > 0;
    const uint64_t x_desc = wgmma::smem_desc_sw128(x_tile + kk * 32);
#pragma unroll
    for (int box = 0; box < 2; ++box) {
      const uint64_t w_desc = wgmma::smem_desc_sw128(w_tile + box * kBoxBytes + kk * 32);
      if constexpr (kFp8)
        wgmma::mma_m64n32k32_e4m3(d[box], w_desc, x_desc, acc);
      else
        wgmma::mma_m64n32k16(d[box], w_desc, x_desc, acc);
    }
  }
  wgmma::commit();
  fence_acc(d);
}

// W8A8: a finished stage's sums into the accumulators, scaled by its weight rows' and pairs'
// scales (the stage's slot, still held); r, c: the thread's box row and pair column (consume).
__device__ __forceinline__ void promote(BoxAcc& acc, const BoxAcc& part, const float* scales, int r, int c) {
#pragma unroll
  for (int box = 0; box < 2; ++box)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float ws = scales[box * kBox + r + 8 * rr];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 4 * j + 2 * rr + h;
          acc[box][i] = fmaf(part[box][i], ws * scales[2 * kBox + 8 * j + c + h], acc[box][i]);
        }
    }
}

template <bool kFp8>
__device__ __forceinline__ void consume(const MoeGemmParams& p, const TileWalk& walk, uint32_t smem_addr,
                                        uint8_t* smem, uint32_t full0, uint32_t empty0) {
  const int kt_count = (p.k + kBK<kFp8> - 1) / kBK<kFp8>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = 16 * warp + (lane >> 2), c = 2 * (lane & 3);
  BoxAcc acc;
  // W8A8: each stage's sums go to part[kt % 2] (accumulate 0 at its first MMA) and are promoted
  // into acc once the next stage's MMAs are issued, so the tensor cores never wait for it
  BoxAcc part[kFp8 ? 2 : 1];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    acc[0][i] = acc[1][i] = 0.f;
#pragma unroll
    for (int b = 0; b < (kFp8 ? 2 : 1); ++b) part[b][0][i] = part[b][1][i] = 0.f;
  }
  auto slot_of = [](int q) { return q % kStages; };
  auto scales_of = [&](int q) {
    return reinterpret_cast<const float*>(smem + slot_of(q) * kStageBytes<kFp8> + kWeightBytes + kXBytes);
  };
  int q = 0;
  for (int ti = blockIdx.x; ti < walk.tiles(); ti += gridDim.x) {
    const Tile t = tile_at(p, walk, ti);
    for (int pass = t.seg_begin; pass < t.seg_end; pass += kPass) {
      if constexpr (kFp8) {
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[0][i] = acc[1][i] = 0.f;
      }
      // One stage: wait for its slot, issue its MMAs (buffer B), retire the stage before.
      auto stage = [&](int kt, auto buffer) {
        [[maybe_unused]] constexpr int B = decltype(buffer)::value;
        wgmma::mbarrier_wait(full0 + slot_of(q) * 8, (q / kStages) & 1);
        // the activation tile came through the generic proxy; the tensor cores read through the async one
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const uint32_t w_tile = smem_addr + slot_of(q) * kStageBytes<kFp8>;
        if constexpr (kFp8)
          stage_mma<true>(part[B], w_tile, false);
        else
          stage_mma<false>(acc, w_tile, kt > 0);
        wgmma::wait<1>();  // the stage before is done: promote it, release its slot
        if (kt > 0) {
          if constexpr (kFp8) {
            fence_acc(part[B ^ 1]);  // its registers are read only after the wait
            promote(acc, part[B ^ 1], scales_of(q - 1), r, c);
          }
          wgmma::mbarrier_arrive(empty0 + slot_of(q - 1) * 8);
        }
        ++q;
      };
      for (int kt = 0; kt < kt_count; kt += 2) {
        stage(kt, std::integral_constant<int, 0>{});
        if (kt + 1 < kt_count) stage(kt + 1, std::integral_constant<int, kFp8 ? 1 : 0>{});
      }
      wgmma::wait<0>();
      if constexpr (kFp8) {
        // the last stage's buffer (compile-time indices keep part in registers)
        if ((kt_count - 1) & 1) {
          fence_acc(part[1]);
          promote(acc, part[1], scales_of(q - 1), r, c);
        } else {
          fence_acc(part[0]);
          promote(acc, part[0], scales_of(q - 1), r, c);
        }
      } else {
        fence_acc(acc);
      }
      wgmma::mbarrier_arrive(empty0 + slot_of(q - 1) * 8);

      // Epilogue: this thread's 8 pairs (4 chunks × 2) of the pass, its two rows of each box.
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = pass + 8 * j + c + h;
          int pair = -1;
          if (row < t.seg_end) {
            const int id = p.sorted_ids[row];
            if (id >= 0 && id < p.num_pairs) pair = id;
          }
          if (p.silu_gate_up) {
            const int col = t.row_block * kBox + r;
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {  // box rows r and r + 8
              const float g = acc[0][4 * j + 2 * rr + h], u = acc[1][4 * j + 2 * rr + h];
              store_out(p, pair, col + 8 * rr, g / (1.f + expf(-g)) * u);
            }
          } else {
#pragma unroll
            for (int box = 0; box < 2; ++box)
#pragma unroll
              for (int rr = 0; rr < 2; ++rr)
                store_out(p, pair, t.row_block * 2 * kBox + box * kBox + r + 8 * rr, acc[box][4 * j + 2 * rr + h]);
          }
        }
    }
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    moe_gemm_tma_kernel(MoeGemmParams p, int row_blocks, const __grid_constant__ CUtensorMap weight_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // full[s]: the producer warp's 32 cp.async arrivals + lane 0's byte count; empty[s]: one
  // arrival per consumer thread
  __shared__ __align__(8) uint64_t bars[2 * kStages];
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const uint32_t empty0 = full0 + kStages * 8;
  wgmma::init_ring_barriers(full0, empty0, kStages, 32 + 1, kConsumerThreads);
  pdl_sync();  // the routing and the activations come from the kernels before
  const TileWalk walk{row_blocks, p.active_experts != nullptr ? p.active_experts[0] : p.num_experts};
  if (threadIdx.x >= kConsumerThreads)
    produce<kFp8>(p, walk, &weight_map, smem, smem_addr, full0, empty0);
  else
    consume<kFp8>(p, walk, smem_addr, smem, full0, empty0);
}

template <bool kFp8>
void launch(const MoeGemmParams& p, cudaStream_t stream) {
  const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * (p.silu_gate_up ? 2 : 1) * p.n;
  MB_CHECK(weight_rows < (int64_t{1} << 31), "moe_gemm_tma: too many weight rows");
  const int row_blocks = p.silu_gate_up ? CEIL_DIV(p.n, kBox) : CEIL_DIV(p.n, 2 * kBox);
  const int64_t experts = p.active_experts != nullptr ? std::min(p.num_experts, p.num_pairs) : p.num_experts;
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t grid = std::min<int64_t>(experts * row_blocks, static_cast<int64_t>(sms) * kCtasPerSm);
  const CUtensorMap map =
      tensor_map_2d(p.weight.data, kFp8 ? TmaElement::U8 : TmaElement::Bf16, weight_rows, p.k, kBox);
  launch_dependent(moe_gemm_tma_kernel<kFp8>, dim3(static_cast<unsigned>(grid)), dim3(kThreads),
                   kSmemBytes<kFp8>, stream, p, row_blocks, map);
  CUDA_CHECK_LAST();
}

#endif  // MOEBATCH_WGMMA

}  // namespace

namespace detail {
void moe_gemm_tma_prepare() {
#if MOEBATCH_WGMMA
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes<false>));
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes<true>));
#endif
}
}  // namespace detail

bool moe_gemm_tma_available(int device) { return moe_wgmma_available(device); }

bool moe_gemm_tma_takes(const MoeGemmParams& p) {
  if (p.in_fp8 != nullptr)  // W8A8: one scale per weight row and stage of 128 inputs
    return p.weight.codec == WeightCodec::Fp8Block && p.weight.group == kMoeGemmA8Group && p.k % kMoeGemmA8Group == 0;
  return p.weight.codec == WeightCodec::Bf16;
}

void moe_gemm_tma(const MoeGemmParams& p, cudaStream_t stream) {
  check_moe_gemm_params(p, "moe_gemm_tma");
  MB_CHECK(!p.direct_topk, "moe_gemm_tma: direct_topk is moe_gemv's (one token)");
  MB_CHECK(moe_gemm_tma_takes(p),
           "moe_gemm_tma: bf16 weights and activations, or FP8 weights in groups of 128 with e4m3 activations");
  if (p.num_pairs == 0) return;
#if MOEBATCH_WGMMA
  if (p.in_fp8 != nullptr)
    launch<true>(p, stream);
  else
    launch<false>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_gemm_tma: this build has no sm_90a code (see moe_gemm_tma_available)");
#endif
}

}  // namespace moebatch::kernels
