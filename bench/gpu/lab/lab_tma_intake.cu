// How fast one SM can take in TMA boxes through a ring of shared-memory slots, with nothing else
// to do: the number that says what the bf16 expert GEMM's ring waits for (docs/design.md,
// session 34). Its tiles wait for their slices 55% of their cycles at ~51 GB/s an SM, and
// sharing the weights across a cluster (a third fewer bytes read from L2) left the waits as they
// were, so L2's read bandwidth is not it. Left: the SM's own intake rate, or the ring's latency
// (the GEMM's math warpgroups hold a slot under its MMA while the next one's MMA is issued, so of
// its 4 slots of 48 KB about 2 are in flight). This kernel measures both sides of that.
//
// One block per SM (or --blocks of them): a producer thread issues `boxes` TMA boxes of 128 rows
// × 64 bf16 (16 KB, the expert GEMM's box, 128-byte swizzle) into each slot of a ring of `slots`
// and a consumer warpgroup waits for each slot and releases it — at once (hold 0), or, as the
// GEMM does, only after the next slot has landed (hold 1). The source is a bf16 [rows, 2048]
// matrix (the weights' k) of `footprint` bytes: L2-resident (16 MB) or not (2 GB); slices walk
// it spread over row tiles and column chunks. Check: every slot's first element against the
// source's pattern (OK / FAIL).
// Rate: bytes taken in a second per SM, and in all, the median of 10 runs after 3 warm-ups.
// Usage: moebatch_lab_tma_intake [out.json] [--blocks N (0: one per SM)]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/tensor_map.cuh"
#include "kernels/wgmma.cuh"
#include "bench/gpu/lab/lab_timing.cuh"

namespace {

namespace wgmma = moebatch::kernels::wgmma;
using moebatch::kernels::TmaElement;
using moebatch::kernels::tensor_map_2d;

constexpr int kCols = 2048;            // the source's row length (bf16): the weights' k
constexpr int kBoxRows = 128;          // a box: 128 rows × 64 bf16
constexpr int kBoxBytes = kBoxRows * 128;
constexpr int kMaxBoxesInRing = 13;    // slots × boxes, within 227 KB
constexpr int kConsumers = 128;        // one warpgroup
constexpr int kThreads = 32 + kConsumers;

struct Config {
  int slots = 4, boxes = 3, hold = 0;
};

// The source's element at (row, col): small integers, exact in bf16.
__host__ __device__ inline float pattern(int64_t row, int col) { return static_cast<float>((row * 7 + col) % 256); }

__global__ void fill_kernel(__nv_bfloat16* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    src[i] = __float2bfloat16(pattern(i / kCols, static_cast<int>(i % kCols)));
}

// Slice i of block b: box j's row tile and column chunk, spread over the source.
__device__ __forceinline__ void box_coords(int b, int64_t i, int j, int row_tiles, int& x, int& y) {
  x = static_cast<int>((i + j) % (kCols / 64)) * 64;
  y = static_cast<int>((b * 37 + i * 13 + j * 5) % row_tiles) * kBoxRows;
}

__global__ void __launch_bounds__(kThreads, 1)
    intake_kernel(const __grid_constant__ CUtensorMap map, Config c, int row_tiles,
                  int64_t slices, unsigned* mismatches) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kMaxBoxesInRing];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  const uint32_t empty0 = full0 + c.slots * 8;
  const int slot_bytes = c.boxes * kBoxBytes;
  wgmma::init_ring_barriers(full0, empty0, c.slots, 1, kConsumers);

  if (threadIdx.x < 32) {
    if (threadIdx.x != 0) return;
    for (int64_t s = 0; s < slices; ++s) {
      const int slot = static_cast<int>(s % c.slots);
      if (s >= c.slots) wgmma::mbarrier_wait(empty0 + slot * 8, static_cast<uint32_t>((s / c.slots - 1) & 1));
      wgmma::mbarrier_arrive_expect_tx(full0 + slot * 8, slot_bytes);
      for (int j = 0; j < c.boxes; ++j) {
        int x = 0, y = 0;
        box_coords(blockIdx.x, s, j, row_tiles, x, y);
        wgmma::tma_load_2d(ring_addr + slot * slot_bytes + j * kBoxBytes, &map, x, y, full0 + slot * 8);
      }
    }
    return;
  }
  // The consumer warpgroup: wait, check, release (hold 1: the slot before, once this one landed).
  const bool checker = threadIdx.x == 32;
  for (int64_t s = 0; s < slices; ++s) {
    const int slot = static_cast<int>(s % c.slots);
    wgmma::mbarrier_wait(full0 + slot * 8, static_cast<uint32_t>((s / c.slots) & 1));
    if (checker) {
      int x = 0, y = 0;
      box_coords(blockIdx.x, s, 0, row_tiles, x, y);
      // element (0, 0) of the box sits at offset 0 in the 128-byte swizzle
      const float got = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(ring + slot * slot_bytes));
      if (got != pattern(y, x)) atomicAdd(mismatches, 1u);
    }
    if (c.hold == 0) {
      wgmma::mbarrier_arrive(empty0 + slot * 8);
    } else if (s > 0) {
      wgmma::mbarrier_arrive(empty0 + static_cast<int>((s - 1) % c.slots) * 8);
    }
  }
}

struct Row {
  std::string source;
  int blocks = 0;
  Config c;
  double gb_s_per_sm = 0, tb_s = 0;
  bool ok = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "lab_tma_intake.json";
  int blocks_arg = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--blocks" && i + 1 < argc) {
      blocks_arg = std::stoi(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: %s [out.json] [--blocks N]\n", argv[0]);
      return 2;
    } else {
      json_path = arg;
    }
  }
  int count = 0, device = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9) {
    std::fprintf(stderr, "TMA rings need a Hopper GPU (sm_90); this is sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  if (blocks_arg < 0 || blocks_arg > sms) {
    std::fprintf(stderr, "--blocks must be 0..%d\n", sms);
    return 2;
  }
  const int smem_max = kMaxBoxesInRing * kBoxBytes + 1024;
  CUDA_CHECK(cudaFuncSetAttribute(intake_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned* mismatches = nullptr;
  CUDA_CHECK(cudaMalloc(&mismatches, sizeof(unsigned)));

  // The GEMM's ring is 4 slots × 3 boxes held one slot (hold 1); the others vary the slots in
  // flight and their size. (hold 1 needs 2 slots at least: the producer's next slot is the held one.)
  const std::vector<Config> configs = {{1, 3, 0}, {2, 3, 0}, {3, 3, 0}, {4, 3, 0}, {4, 3, 1},
                                       {12, 1, 0}, {12, 1, 1}, {6, 2, 1}};
  std::vector<Row> rows;
  for (const int64_t footprint : {int64_t{16} << 20, int64_t{2048} << 20}) {
    const int64_t n_rows = footprint / (kCols * 2);
    const int row_tiles = static_cast<int>(n_rows / kBoxRows);
    __nv_bfloat16* src = nullptr;
    CUDA_CHECK(cudaMalloc(&src, footprint));
    fill_kernel<<<4 * sms, 256, 0, stream>>>(src, n_rows * kCols);
    CUDA_CHECK(cudaGetLastError());
    const CUtensorMap map = tensor_map_2d(src, TmaElement::Bf16, n_rows, kCols, kBoxRows);
    for (const int blocks : {1, blocks_arg > 0 ? blocks_arg : sms}) {
      for (const Config& c : configs) {
        const int64_t slot_bytes = int64_t{c.boxes} * kBoxBytes;
        const int64_t slices = (int64_t{64} << 20) / slot_bytes;  // 64 MB a block
        const int smem = c.slots * c.boxes * kBoxBytes + 1024;
        const auto run = [&] {
          intake_kernel<<<blocks, kThreads, smem, stream>>>(map, c, row_tiles, slices, mismatches);
          CUDA_CHECK(cudaGetLastError());
        };
        CUDA_CHECK(cudaMemsetAsync(mismatches, 0, sizeof(unsigned), stream));
        const double seconds = 1e-3 * moebatch::lab::median_ms(stream, run, 3, 10);
        unsigned bad = 0;
        CUDA_CHECK(cudaMemcpy(&bad, mismatches, sizeof(unsigned), cudaMemcpyDeviceToHost));
        const double bytes = static_cast<double>(slices * slot_bytes);
        rows.push_back({footprint <= (int64_t{64} << 20) ? "L2 16 MB" : "HBM 2 GB", blocks, c,
                        bytes / seconds / 1e9, bytes * blocks / seconds / 1e12, bad == 0});
      }
    }
    CUDA_CHECK(cudaFree(src));
  }

  std::printf("TMA boxes of 16 KB into a ring per SM, a consumer warpgroup releasing each slot (%s, %d SMs)\n",
              prop.name, sms);
  std::printf("%-9s %6s %6s %6s %5s %12s %9s %6s\n", "source", "blocks", "slots", "boxes", "hold", "GB/s per SM",
              "TB/s", "check");
  nlohmann::json out = nlohmann::json::array();
  bool all_ok = true;
  for (const Row& r : rows) {
    std::printf("%-9s %6d %6d %6d %5d %12.1f %9.2f %6s\n", r.source.c_str(), r.blocks, r.c.slots, r.c.boxes,
                r.c.hold, r.gb_s_per_sm, r.tb_s, r.ok ? "OK" : "FAIL");
    out.push_back({{"source", r.source}, {"blocks", r.blocks}, {"slots", r.c.slots}, {"boxes", r.c.boxes},
                   {"hold", r.c.hold}, {"gb_s_per_sm", r.gb_s_per_sm}, {"tb_s", r.tb_s}, {"ok", r.ok}});
    all_ok = all_ok && r.ok;
  }
  std::ofstream(json_path) << out.dump(2) << "\n";
  CUDA_CHECK(cudaFree(mismatches));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return all_ok ? 0 : 1;
}
