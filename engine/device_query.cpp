#include "engine/device_query.h"

#ifdef MOEBATCH_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace moebatch {

bool cuda_backend_built() {
#ifdef MOEBATCH_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count(std::string* why) {
#ifdef MOEBATCH_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no device";
  return n;
#else
  if (why) *why = "built without the CUDA backend";
  return 0;
#endif
}

std::optional<GpuMemory> gpu_memory(int device) {
#ifdef MOEBATCH_HAVE_CUDA
  // The calling thread may be any thread (the HTTP handler): select the device first. The
  // backend uses the same device's primary context, so this creates no second context.
  if (cudaSetDevice(device) != cudaSuccess) return std::nullopt;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return std::nullopt;
  return GpuMemory{static_cast<int64_t>(total_b - free_b), static_cast<int64_t>(total_b)};
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace moebatch
