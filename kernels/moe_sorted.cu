#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_sorted.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kThreads = 256;

// One thread per 8 values of a sorted row; grid-stride over rows_cap · hidden / 8 (the row
// count is known only on the device).
__global__ void __launch_bounds__(kThreads) moe_gather_sorted_kernel(MoeGatherParams p) {
  pdl_sync();
  const int total = p.expert_offsets[p.num_experts];
  const int vec_per_row = p.hidden / 8;
  const size_t n = static_cast<size_t>(total) * vec_per_row;
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(v / vec_per_row);
    const int c = static_cast<int>(v % vec_per_row) * 8;
    const int id = p.sorted_ids[i];
    const bool real = id >= 0 && id < p.num_pairs;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (real) {
      val = *reinterpret_cast<const uint4*>(p.in + static_cast<size_t>(id / p.in_row_div) * p.hidden + c);
      if (c == 0) p.row_of_pair[id] = i;
    }
    *reinterpret_cast<uint4*>(p.out + static_cast<size_t>(i) * p.hidden + c) = val;
  }
}

}  // namespace

void moe_gather_sorted(const MoeGatherParams& p, cudaStream_t stream) {
  MB_CHECK(p.hidden > 0 && p.hidden % 8 == 0 && p.num_experts > 0 && p.in_row_div > 0 &&
               p.num_pairs >= 0 && p.rows_cap >= 0,
           "moe_gather_sorted: bad shape");
  MB_CHECK(p.out && p.row_of_pair && p.in && p.sorted_ids && p.expert_offsets,
           "moe_gather_sorted: null operand");
  if (p.num_pairs == 0 || p.rows_cap == 0) return;
  const size_t vectors = static_cast<size_t>(p.rows_cap) * (p.hidden / 8);
  const size_t blocks = CEIL_DIV(vectors, static_cast<size_t>(kThreads));
  launch_dependent(moe_gather_sorted_kernel, static_cast<int>(blocks < 65536 ? blocks : 65536),
                   kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
