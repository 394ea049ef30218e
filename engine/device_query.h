// What the engine factory and the service need to know about CUDA without including CUDA
// headers: whether this build has the CUDA backend, how many devices are visible, and a device's
// memory (cudaMemGetInfo). Without the CUDA backend every answer is "none", so callers need no
// #ifdef.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moebatch {

/// Memory of one device, bytes.
struct GpuMemory {
  int64_t used = 0;   ///< total - free, every process together
  int64_t total = 0;  ///< device memory
};

/// True when this build links the CUDA backend.
bool cuda_backend_built();

/// Visible CUDA devices; 0 without the CUDA backend or without a usable driver/device. `why`,
/// when given, receives the runtime's reason for 0.
int cuda_device_count(std::string* why = nullptr);

/// Used and total memory of `device`; nullopt without the CUDA backend or when the query fails.
/// Thread-safe (the runtime call is).
std::optional<GpuMemory> gpu_memory(int device);

}  // namespace moebatch
