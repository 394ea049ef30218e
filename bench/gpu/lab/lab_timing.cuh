// The kernel lab's clock: the median of CUDA-event timings of one piece of work, after warm-ups.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda_check.cuh"

namespace moebatch::lab {

/// Median ms of `run()` (which issues its work on `stream`) over `reps` timed runs, after
/// `warmups` untimed ones.
template <typename Run>
double median_ms(cudaStream_t stream, Run run, int warmups, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmups; ++i) run();
  std::vector<float> ms(reps);
  for (float& t : ms) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    run();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace moebatch::lab
