#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256

// One warp per (token, head); lane owns rotation pairs i = lane + 32*j.
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_kernel(QkNormRopeParams p) {
  const int t = blockIdx.y;
  const int head = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (head >= p.n_q_heads + p.n_kv_heads) return;
  const bool is_q = head < p.n_q_heads;
  bf16* x = is_q ? p.q + t * p.q_stride + static_cast<int64_t>(head) * p.head_dim
                 : p.k + t * p.k_stride + static_cast<int64_t>(head - p.n_q_heads) * p.head_dim;
  const bf16* w = is_q ? p.q_norm : p.k_norm;
  const int half = p.head_dim / 2;

  float a[kMaxPairsPerLane], b[kMaxPairsPerLane];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    a[j] = i < half ? __bfloat162float(x[i]) : 0.f;
    b[j] = i < half ? __bfloat162float(x[i + half]) : 0.f;
    ss += a[j] * a[j] + b[j] * b[j];
  }
  float rstd = 1.f;
  if (w != nullptr) rstd = rsqrtf(warp_sum(ss) / p.head_dim + p.eps);
  const float pos = static_cast<float>(p.positions[t]);
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    float xa = a[j] * rstd, xb = b[j] * rstd;
    if (w != nullptr) {
      xa *= __bfloat162float(w[i]);
      xb *= __bfloat162float(w[i + half]);
    }
    // fp32 angle as the reference implementation computes it; precise sincosf, since the
    // angle grows to ~1e5 radians at long positions.
    const float inv_freq = 1.f / powf(p.theta, static_cast<float>(2 * i) / p.head_dim);
    float s, c;
    sincosf(pos * inv_freq, &s, &c);
    x[i] = __float2bfloat16(xa * c - xb * s);
    x[i + half] = __float2bfloat16(xb * c + xa * s);
  }
}

}  // namespace

void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream) {
  MB_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 64 * kMaxPairsPerLane,
           "qk_norm_rope: head_dim must be even and <= 256");
  MB_CHECK(p.q && p.k && p.positions, "qk_norm_rope: null operand");
  MB_CHECK(p.q_stride >= static_cast<int64_t>(p.n_q_heads) * p.head_dim &&
               p.k_stride >= static_cast<int64_t>(p.n_kv_heads) * p.head_dim,
           "qk_norm_rope: stride smaller than the heads it holds");
  MB_CHECK((p.q_norm == nullptr) == (p.k_norm == nullptr), "qk_norm_rope: give both norms or none");
  if (p.tokens == 0) return;
  MB_CHECK(p.tokens <= 65535, "qk_norm_rope: tokens exceed grid.y");
  const dim3 grid(CEIL_DIV(p.n_q_heads + p.n_kv_heads, kWarps), p.tokens);
  qk_norm_rope_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
