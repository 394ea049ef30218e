// Programmatic dependent launch (PDL, compute capability 9.0): a step is a chain of ~10 small
// kernels per layer, each reading what the one before it wrote, and in a CUDA graph each still
// pays launch latency plus a ramp-up and a tail in which most SMs idle. A kernel launched by
// launch_dependent may be scheduled while the kernel before it in the stream is still running;
// it runs its preamble — loads of constants only, e.g. a GEMV's weight rows — then waits in
// pdl_sync() until that kernel has completed and its writes are visible.
//
// The contract, for every kernel launched through launch_dependent:
//   - pdl_sync() comes before its first read of anything an earlier kernel wrote and before its
//     first global write (a kernel before it may still read what it overwrites);
//   - at least one thread of the grid calls it. A kernel then cannot complete before the one
//     before it has, so completion stays ordered along the stream as without PDL: a kernel two
//     launches back has finished once pdl_sync() returns.
// Documented exceptions, reads before pdl_sync of what no kernel of the last two launches wrote:
// step inputs (uploaded before the forward call's first kernel) and cache rows of earlier forward
// calls by the split decode attention kernel (kernels/attention_decode.cu, decode_prefetch, says
// why that is sound); the slots and the rotation table (the forward's second kernel, complete
// once the first layer's norm has passed its pdl_sync) by the wide qk_norm_rope kernel.
// A kernel that calls pdl_sync() but is launched plainly (<<<...>>>) simply finds nothing to wait
// for. Kernels from libraries (cuBLAS, NCCL) never signal early, so one launched after them starts
// at their completion, as before.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda_check.cuh"
#include "kernels/step_trace.cuh"

namespace moebatch::kernels {

/// Waits until the previous kernel in the stream has completed and its memory is visible, then
/// lets the next kernel (if launched dependent) be scheduled. Both are no-ops without PDL.
__device__ __forceinline__ void pdl_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Lets the next kernel (if launched dependent) be scheduled now, before this kernel's own
/// pdl_sync: its blocks become resident and run their preamble under this kernel's work instead
/// of after its wait. Sound where the next kernel's preamble reads nothing this kernel's
/// predecessor writes — under the contract above a preamble reads constants, step inputs and
/// earlier forward calls' writes only — so not before a reader of settled routing
/// (MoeGemmParams::routing_settled), which counts on the kernel before it launching it only
/// after its wait. The kernel still calls pdl_sync() before its reads and writes.
__device__ __forceinline__ void pdl_trigger_early() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#if MOEBATCH_STEP_TRACE && defined(__CUDACC__)
namespace {
/// pdl_sync with the wait's ends recorded (kernels/step_trace.cuh); the macro below sends every
/// pdl_sync() call here in a traced build.
__device__ __forceinline__ void pdl_sync_traced(unsigned line) {
  const bool first = step_trace_first_thread();
  const unsigned long long before = first ? step_trace_ns() : 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (first) step_trace_record(before, line);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
}  // namespace
#define pdl_sync() ::moebatch::kernels::pdl_sync_traced(__LINE__)
#endif

/// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch (see the
/// contract above), in thread block clusters of cluster_x blocks along x where cluster_x > 1
/// (compute capability 9.0; grid.x a multiple of it). Captured into a CUDA graph, the dependency
/// becomes a programmatic edge.
template <typename... Params, typename... Args>
void launch_dependent_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, int cluster_x,
                               cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(cluster_x);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = cluster_x > 1 ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// Whether the current device launches thread block clusters (compute capability 9.0).
inline bool device_has_clusters() {
  int device = 0, clusters = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device));
  return clusters != 0;
}

/// launch_dependent_clusters without clusters.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  launch_dependent_clusters(kernel, grid, block, smem, 1, stream, std::forward<Args>(args)...);
}

/// Whether a grid of `blocks` blocks of `kernel` overflows one wave of resident blocks on the
/// current device while `wide_blocks` of `wide` (the same work with more per block) fit in one:
/// then the few blocks of the second wave would each cost a whole load round trip more, and the
/// wider launch is the faster one. `threads` per block, no dynamic shared memory, for both.
/// Host-side queries, so also usable while a stream is being captured.
template <typename... Params, typename... WideParams>
bool wider_saves_a_wave(void (*kernel)(Params...), int64_t blocks, void (*wide)(WideParams...),
                        int64_t wide_blocks, int threads) {
  int device = 0, sms = 0, per_sm = 0, wide_per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&wide_per_sm, wide, threads, 0));
  return blocks > static_cast<int64_t>(sms) * per_sm &&
         wide_blocks <= static_cast<int64_t>(sms) * wide_per_sm;
}

}  // namespace moebatch::kernels
