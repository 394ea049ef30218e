// Types shared by every kernel header. Storage is bf16; arithmetic inside kernels is fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moebatch::kernels {

using bf16 = __nv_bfloat16;

}  // namespace moebatch::kernels
