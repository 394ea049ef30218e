// Where a graph-replayed step's time goes, kernel by kernel, in a diagnostic build only (cmake
// -DMOEBATCH_STEP_TRACE=ON; otherwise this header declares nothing and pdl_sync is unchanged).
//
// Why: with programmatic dependent launch (kernels/launch.cuh) the kernels of a step overlap —
// each one's preamble runs under the kernel before — so neither per-kernel profiler times nor
// eager stage events say what a kernel adds to the step. What it adds is the time from its
// predecessor's pdl_sync returning to its own returning: every kernel of the step waits there
// for the one before to complete, so those return times are the step's critical path in order.
// Thread 0 of block 0 of every kernel that calls pdl_sync records %globaltimer before and after
// the wait, with its call site and grid size; take_step_trace() returns them sorted.
//
// Each translation unit that includes this header has its own record buffer (the kernel
// library is built without relocatable device code, so a __device__ variable cannot be shared
// across files); a registrar per unit lets take_step_trace() collect them all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#if MOEBATCH_STEP_TRACE
#include <cuda_runtime.h>

#include "kernels/cuda_check.cuh"
#endif

namespace moebatch::kernels {

/// One kernel's pass through pdl_sync (block 0, thread 0), in ns of the GPU's global timer.
struct StepTraceSample {
  std::string file;      ///< the kernel's source file
  int line = 0;          ///< the pdl_sync call site
  uint32_t blocks = 0;   ///< grid size
  uint64_t before = 0;   ///< reached pdl_sync (its preamble done)
  uint64_t after = 0;    ///< the kernel before it has completed
  uint64_t clock = 0;    ///< the SM's cycle counter at `after` (clock64: per SM, not global)
  uint32_t sm = 0;       ///< the SM that recorded it (%smid)
};

/// Every unit's samples since the last call, sorted by `after`; the buffers are reset. Empty
/// in a build without the trace.
std::vector<StepTraceSample> take_step_trace();

#if MOEBATCH_STEP_TRACE
struct StepTraceRecord {
  unsigned long long before, after, clock;
  unsigned line, blocks, sm;
};
inline constexpr unsigned kStepTraceCapacity = 8192;  // per unit; a 48-layer step records ~450

using StepTraceTake = void (*)(std::vector<StepTraceSample>& out);
/// Adds a unit's take function to the registry take_step_trace() walks (static initialization).
bool register_step_trace_unit(StepTraceTake take);
#endif

#if MOEBATCH_STEP_TRACE && defined(__CUDACC__)  // the buffers and the recording: CUDA units only
namespace {
__device__ StepTraceRecord step_trace_records[kStepTraceCapacity];
__device__ unsigned step_trace_count;

__device__ __forceinline__ unsigned long long step_trace_ns() {
  unsigned long long t = 0;
#ifdef __CUDA_ARCH__
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
  return t;
}

__device__ __forceinline__ bool step_trace_first_thread() {
  return blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0 && threadIdx.y == 0 &&
         threadIdx.z == 0;
}

__device__ __forceinline__ void step_trace_record(unsigned long long before, unsigned line) {
  const unsigned i = atomicAdd(&step_trace_count, 1u);
  unsigned sm = 0;
#ifdef __CUDA_ARCH__
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#endif
  const unsigned long long clock = clock64(), now = step_trace_ns();
  if (i < kStepTraceCapacity) step_trace_records[i] = {before, now, clock, line, gridDim.x * gridDim.y * gridDim.z, sm};
}

/// A point inside a kernel, by the calling thread (before = after = now): where a kernel's time
/// between its pdl_sync and the next kernel's goes. Through STEP_TRACE_MARK_IF below.
__device__ __forceinline__ void step_trace_mark(unsigned line) { step_trace_record(step_trace_ns(), line); }

void step_trace_take_unit(std::vector<StepTraceSample>& out) {
  unsigned count = 0;
  CUDA_CHECK(cudaMemcpyFromSymbol(&count, step_trace_count, sizeof(count)));
  count = count < kStepTraceCapacity ? count : kStepTraceCapacity;
  std::vector<StepTraceRecord> records(count);
  if (count > 0)
    CUDA_CHECK(cudaMemcpyFromSymbol(records.data(), step_trace_records, count * sizeof(StepTraceRecord)));
  const unsigned zero = 0;
  CUDA_CHECK(cudaMemcpyToSymbol(step_trace_count, &zero, sizeof(zero)));
  for (const StepTraceRecord& r : records)
    out.push_back({__BASE_FILE__, static_cast<int>(r.line), r.blocks, r.before, r.after, r.clock, r.sm});
}
[[maybe_unused]] const bool step_trace_registered = register_step_trace_unit(&step_trace_take_unit);
}  // namespace
#endif

}  // namespace moebatch::kernels

// STEP_TRACE_MARK_IF(cond): a step-trace sample at this line by each thread for which cond holds
// (make it one thread), in a diagnostic build; nothing (cond not evaluated) otherwise.
#if MOEBATCH_STEP_TRACE && defined(__CUDACC__)
#define STEP_TRACE_MARK_IF(cond) \
  do {                           \
    if (cond) ::moebatch::kernels::step_trace_mark(__LINE__); \
  } while (0)
#else
#define STEP_TRACE_MARK_IF(cond) \
  do {                           \
    (void)sizeof(cond);          \
  } while (0)
#endif
