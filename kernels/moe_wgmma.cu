// Grouped expert GEMM on wgmma (kernels/moe_wgmma.cuh). One block computes a 128-row × 256-column
// tile of one expert's output: two warpgroups, each a 64-row slab, share the 256 weight rows.
// k moves through a 4-stage cp.async pipeline of 64-wide slices laid out with the 128-byte
// swizzle wgmma reads (kernels/wgmma.cuh); the block prefetches two slices ahead of the one its
// tensor cores work on while the previous slice's MMAs may still run. The epilogue stages the
// tile in shared memory so that every row leaves in 16-byte stores. With sorted_ids the A rows
// come straight from the tokens' rows (the gather of the gate+up stage, fused).
//
// Built for sm_90a only (MOEBATCH_WGMMA, set by kernels/CMakeLists.txt); without it the entry
// points exist and moe_wgmma_available says false.
#include "kernels/moe_wgmma.cuh"

#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_tiles.cuh"
#if MOEBATCH_WGMMA
#include "kernels/wgmma.cuh"
#endif

namespace moebatch::kernels {
namespace {

constexpr int kBM = 128;     // rows per block: one 64-row slab per warpgroup
constexpr int kBN = 256;     // weight rows per block (gate+up: 128 gate rows and the same 128 up rows)
constexpr int kBK = 64;      // k per stage: one 128-byte swizzled row
constexpr int kStages = 4;   // slots: computing, draining (previous MMAs), two in flight
constexpr int kThreads = 256;
constexpr int kATile = kBM * kBK * 2;  // bytes; multiples of 1024 keep every tile aligned
constexpr int kBTile = kBN * kBK * 2;
constexpr int kStageBytes = kATile + kBTile;
constexpr int kOutPitch = kBN + 8;     // epilogue staging row (elements): 16 bytes of padding
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + slack to align the base to 1024
static_assert(kBM * kOutPitch * 2 <= kStages * kStageBytes, "the output tile reuses the stages");

#if MOEBATCH_WGMMA

template <bool kSilu>
__global__ void __launch_bounds__(kThreads, 1) moe_wgmma_kernel(MoeWgmmaParams p, int n_tiles) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ MoeTile tile;
  __shared__ int found;
  const int m = static_cast<int>(blockIdx.x / n_tiles), n_tile = static_cast<int>(blockIdx.x % n_tiles);
  if (threadIdx.x < 32) {
    const bool f = find_moe_tile<kBM>(p.expert_offsets, p.num_experts, m, tile);
    if (threadIdx.x == 0) found = f;
  }
  __syncthreads();
  if (!found) return;
  const MoeTile t = tile;

  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int wg = threadIdx.x >> 7;  // warpgroup: rows [64·wg, 64·wg + 64) of the tile
  const int half = p.n / 2;         // kSilu: gate rows [0, half), up rows [half, n)
  const bf16* w_expert = p.weight + static_cast<size_t>(t.expert) * p.n * p.k;

  // Weight row of tile row r (0..kBN-1), -1 past the expert's rows.
  auto weight_row = [&](int r) {
    if constexpr (kSilu) {
      const int c = n_tile * (kBN / 2) + (r & (kBN / 2 - 1));
      return c < half ? (r < kBN / 2 ? c : half + c) : -1;
    } else {
      const int c = n_tile * kBN + r;
      return c < p.n ? c : -1;
    }
  };

  // Each thread copies 16-byte chunk (threadIdx.x % 8) of rows threadIdx.x / 8 + 32·i; a_src[i]
  // is the row of `in` that A row i holds, -1 for zeros (past the segment, padding pairs).
  const int chunk = threadIdx.x & 7, row_in_pass = threadIdx.x >> 3;
  int a_src[kBM / 32];
#pragma unroll
  for (int i = 0; i < kBM / 32; ++i) {
    const int r = row_in_pass + 32 * i, row = t.row0 + r;
    a_src[i] = r < t.rows ? row : -1;
    if (p.sorted_ids && r < t.rows) {
      const int id = p.sorted_ids[row];
      const bool real = id >= 0 && id < p.num_pairs;
      a_src[i] = real ? id / p.in_row_div : -1;
      if (real && p.row_of_pair && n_tile == 0 && chunk == 0) p.row_of_pair[id] = row;
    }
  }
  auto load_stage = [&](int slot, int kt) {
    const int col = kt * kBK + chunk * 8;
    uint8_t* a_tile = smem + slot * kStageBytes;
    uint8_t* b_tile = a_tile + kATile;
#pragma unroll
    for (int i = 0; i < kBM / 32; ++i) {
      const int r = row_in_pass + 32 * i;
      const bool ok = col < p.k && a_src[i] >= 0;
      const bf16* src = ok ? p.in + static_cast<size_t>(a_src[i]) * p.k + col : p.in;
      cp_async16(a_tile + wgmma::sw128_offset(r, chunk), src, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kBN / 32; ++i) {
      const int r = row_in_pass + 32 * i;
      const int wr = weight_row(r);
      const bool ok = col < p.k && wr >= 0;
      const bf16* src = ok ? w_expert + static_cast<size_t>(wr) * p.k + col : p.weight;
      cp_async16(b_tile + wgmma::sw128_offset(r, chunk), src, ok ? 16 : 0);
    }
  };

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;

  const int kt_count = (p.k + kBK - 1) / kBK;
  // Prologue: slices 0 and 1 in flight. Every iteration commits one group (possibly empty), so
  // "all but the newest group done" always means "slice kt has landed".
#pragma unroll
  for (int s = 0; s < kStages - 2; ++s) {
    if (s < kt_count) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<kStages - 3>();
    // This thread's copies of slice kt become visible to the tensor cores (async proxy), and
    // after the barrier everyone's are; every warpgroup has also finished slice kt - 2's MMAs
    // (wait<1> below), so its slot can be refilled.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + kStages - 2 < kt_count) load_stage((kt + kStages - 2) % kStages, kt + kStages - 2);
    cp_async_commit();

    const uint32_t a_addr = smem_addr + (kt % kStages) * kStageBytes + wg * (kATile / 2);
    const uint32_t b_addr = smem_addr + (kt % kStages) * kStageBytes + kATile;
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma::mma_m64n256k16(acc, wgmma::smem_desc_sw128(a_addr + kk * 32), wgmma::smem_desc_sw128(b_addr + kk * 32), 1);
    wgmma::commit();
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
    wgmma::wait<1>();
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup is done with the stages: they hold the output tile now

  // Accumulators → bf16 tile in shared memory (layout: kernels/wgmma.cuh), then 16-byte rows out.
  bf16* out_tile = reinterpret_cast<bf16*>(smem);
  const int lane = threadIdx.x & 31;
  const int r = wg * 64 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2), c = 2 * (lane & 3);
  if constexpr (kSilu) {
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      const float* g = &acc[4 * j];
      const float* u = &acc[4 * (j + kBN / 16)];
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[r * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(g[0] / (1.f + expf(-g[0])) * u[0], g[1] / (1.f + expf(-g[1])) * u[1]);
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[(r + 8) * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(g[2] / (1.f + expf(-g[2])) * u[2], g[3] / (1.f + expf(-g[3])) * u[3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[r * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(&out_tile[(r + 8) * kOutPitch + 8 * j + c]) =
          __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  __syncthreads();
  const int tile_cols = kSilu ? kBN / 2 : kBN, out_cols = kSilu ? half : p.n;
  const int col0 = n_tile * tile_cols, chunks_per_row = tile_cols / 8;
  for (int i = threadIdx.x; i < kBM * chunks_per_row; i += kThreads) {
    const int row = i / chunks_per_row, col = (i % chunks_per_row) * 8;
    if (row < t.rows && col0 + col < out_cols)
      *reinterpret_cast<uint4*>(p.out + static_cast<size_t>(t.row0 + row) * out_cols + col0 + col) =
          *reinterpret_cast<const uint4*>(&out_tile[row * kOutPitch + col]);
  }
}

template <bool kSilu>
void launch(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = kSilu ? p.n / 2 : p.n, tile_cols = kSilu ? kBN / 2 : kBN;
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  const int64_t blocks = moe_row_tiles_bound(p.rows_cap, p.num_experts, kBM) * n_tiles;
  MB_CHECK(blocks < (int64_t{1} << 31), "moe_wgmma: too many tiles");
  moe_wgmma_kernel<kSilu><<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(p, n_tiles);
  CUDA_CHECK_LAST();
}

#endif  // MOEBATCH_WGMMA

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void moe_wgmma_prepare() {
#if MOEBATCH_WGMMA
  CUDA_CHECK(cudaFuncSetAttribute(moe_wgmma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CUDA_CHECK(cudaFuncSetAttribute(moe_wgmma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  detail::moe_wgmma_fp8_prepare();
#endif
}

bool moe_wgmma_available(int device) {
#if MOEBATCH_WGMMA
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
#else
  (void)device;
  return false;
#endif
}

void moe_wgmma(const MoeWgmmaParams& p, cudaStream_t stream) {
  const int out_cols = p.silu_gate_up ? p.n / 2 : p.n;
  MB_CHECK(p.num_experts > 0 && p.n > 0 && p.k > 0 && p.rows_cap >= 0, "moe_wgmma: bad shape");
  MB_CHECK(out_cols % 8 == 0 && p.k % 8 == 0 && (!p.silu_gate_up || p.n % 2 == 0),
           "moe_wgmma: output columns and k must be multiples of 8");
  MB_CHECK(p.out && p.in && p.weight && p.expert_offsets, "moe_wgmma: null operand");
  MB_CHECK(!p.sorted_ids || (p.num_pairs >= 0 && p.in_row_div > 0), "moe_wgmma: bad gather");
  MB_CHECK(aligned16(p.out) && aligned16(p.in) && aligned16(p.weight), "moe_wgmma: operands must be 16-byte aligned");
  if (p.rows_cap == 0) return;
#if MOEBATCH_WGMMA
  if (p.silu_gate_up)
    launch<true>(p, stream);
  else
    launch<false>(p, stream);
#else
  (void)stream;
  MB_CHECK(false, "moe_wgmma: this build has no sm_90a code (see moe_wgmma_available)");
#endif
}

}  // namespace moebatch::kernels
