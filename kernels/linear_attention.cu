#include <climits>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gated_delta_chunked.cuh"
#include "kernels/launch.cuh"
#include "kernels/linear_attention.cuh"

namespace moebatch::kernels {
namespace {

using gdn::bf;
using gdn::conv_dim;
using gdn::fresh_state;
using gdn::kL2NormEps;
using gdn::softplus;

constexpr int kConvDecodeThreads = 128;
// Prefill conv: a block is 32 channels (one warp reads 64 contiguous bytes of a token's row)
// × 8 thread rows; a thread row takes 8 consecutive tokens per step, a step 64 tokens.
constexpr int kConvChannels = 32, kConvRows = 8, kConvRun = 8;
constexpr int kMaxConvKernel = 8;  // K − 1 ≤ kConvRun: only a sequence's first run reads state

// Delta rule: a warp = 8 columns of S × 4 row parts (lane = part · 8 + column), 4 warps = 32
// columns per block. Part p holds rows p, p + 4, p + 8, ...: the 4 parts read 4 consecutive
// shared words of q and k (no bank conflict) and a warp's state load covers 4 rows × 32 bytes.
constexpr int kRuleWarps = 4, kRuleParts = 4, kRuleWarpCols = 32 / kRuleParts;
constexpr int kRuleCols = kRuleWarps * kRuleWarpCols;
constexpr int kRuleChunk = 16;  // prefill: tokens staged per step

constexpr int kNormWarps = 4;

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// Column of proj holding conv channel c (channels q | k | v, head-major; layout in the header).
__device__ __forceinline__ int64_t conv_channel_col(const GdnDims& d, int c) {
  const int r = d.nv / d.nk, grp = 2 * d.dk + 2 * r * d.dv, key = d.nk * d.dk;
  if (c < key) return static_cast<int64_t>(c / d.dk) * grp + c % d.dk;
  if (c < 2 * key) {
    c -= key;
    return static_cast<int64_t>(c / d.dk) * grp + d.dk + c % d.dk;
  }
  c -= 2 * key;
  return static_cast<int64_t>(c / (r * d.dv)) * grp + 2 * d.dk + c % (r * d.dv);
}

// --- causal conv + SiLU ---------------------------------------------------------------------

template <int K>
__global__ void __launch_bounds__(kConvDecodeThreads)
    causal_conv_decode_kernel(CausalConvParams p) {
  pdl_sync();
  const int C = conv_dim(p.dims), s = blockIdx.y;
  const int c = blockIdx.x * kConvDecodeThreads + threadIdx.x;
  if (c >= C) return;
  const int t0 = p.seqs.q_start[s], t1 = p.seqs.q_start[s + 1];
  if (t1 <= t0) return;
  const int slot = p.seqs.state_slots[s];
  const bool fresh = fresh_state(p.seqs, t0, slot);
  // size_t: slots · C · (K−1) overflows int for large pools
  float* st = slot >= 0 ? p.conv_state + (static_cast<size_t>(slot) * C + c) * (K - 1) : nullptr;
  float w[K], win[K - 1];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = bf(p.weight[static_cast<size_t>(c) * K + j]);
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = fresh ? 0.f : st[j];
  const bf16* in = p.proj + conv_channel_col(p.dims, c);
  for (int t = t0; t < t1; ++t) {
    const float x = bf(in[static_cast<int64_t>(t) * p.proj_stride]);
    float acc = w[K - 1] * x;  // the CPU's order: newest input first, then the window
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc += w[j] * win[j];
#pragma unroll
    for (int j = 0; j + 2 < K; ++j) win[j] = win[j + 1];
    win[K - 2] = x;
    p.out[static_cast<int64_t>(t) * C + c] = __float2bfloat16(silu(acc));
  }
  if (st != nullptr) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) st[j] = win[j];
  }
}

// Thread (x, y) is channel blockIdx.x·32 + x and takes tokens [m0, m0 + 8) of the run for
// m0 = 8y, 8y + 64, ...; its window's K−1 older inputs come from proj, except for m0 = 0 where
// they are the old state. So only the y = 0 thread of a channel reads the state, and it alone
// writes the new one (the run's last K−1 inputs, partly old state when the run is shorter):
// no barrier, no race.
template <int K>
__global__ void __launch_bounds__(kConvChannels* kConvRows)
    causal_conv_prefill_kernel(CausalConvParams p) {
  pdl_sync();
  static_assert(K - 1 <= kConvRun, "a run's window must reach back at most one step");
  const int C = conv_dim(p.dims), s = blockIdx.y;
  const int c = blockIdx.x * kConvChannels + threadIdx.x;
  if (c >= C) return;
  const int t0 = p.seqs.q_start[s], len = p.seqs.q_start[s + 1] - t0;
  if (len <= 0) return;
  const int slot = p.seqs.state_slots[s];
  const bool first_row = threadIdx.y == 0;
  float* st = slot >= 0 ? p.conv_state + (static_cast<size_t>(slot) * C + c) * (K - 1) : nullptr;
  float old[K - 1];
  const bool load_old = first_row && !fresh_state(p.seqs, t0, slot);
#pragma unroll
  for (int j = 0; j < K - 1; ++j) old[j] = load_old ? st[j] : 0.f;
  float w[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = bf(p.weight[static_cast<size_t>(c) * K + j]);
  const bf16* in = p.proj + conv_channel_col(p.dims, c) + static_cast<int64_t>(t0) * p.proj_stride;

  for (int m0 = threadIdx.y * kConvRun; m0 < len; m0 += kConvRows * kConvRun) {
    float x[K - 1 + kConvRun];  // inputs at offsets m0 − (K−1) .. m0 + kConvRun − 1 of the run
#pragma unroll
    for (int e = 0; e < K - 1 + kConvRun; ++e) {
      const int m = m0 - (K - 1) + e;
      if (m0 == 0 && e < K - 1)
        x[e] = old[e];  // m = e − (K−1) < 0: the state holds offset m at index K−1+m = e
      else
        x[e] = m < len ? bf(in[static_cast<int64_t>(m) * p.proj_stride]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kConvRun; ++u) {
      if (m0 + u >= len) break;
      float acc = w[K - 1] * x[u + K - 1];
#pragma unroll
      for (int j = 0; j < K - 1; ++j) acc += w[j] * x[u + j];
      p.out[static_cast<int64_t>(t0 + m0 + u) * C + c] = __float2bfloat16(silu(acc));
    }
  }
  if (first_row && st != nullptr) {
    // the new state: the last K−1 inputs of old state then run, by shifting the run's last
    // min(len, K−1) inputs into the old window (compile-time indices keep old[] in registers)
    for (int m = max(0, len - (K - 1)); m < len; ++m) {
#pragma unroll
      for (int j = 0; j + 2 < K; ++j) old[j] = old[j + 1];
      old[K - 2] = bf(in[static_cast<int64_t>(m) * p.proj_stride]);
    }
#pragma unroll
    for (int j = 0; j < K - 1; ++j) st[j] = old[j];
  }
}

// --- gated delta rule -----------------------------------------------------------------------

template <int N>
__device__ __forceinline__ float sum(const float (&a)[N]) {
  float s = a[0];
#pragma unroll
  for (int i = 1; i < N; ++i) s += a[i];
  return s;
}

// Block (column tile, value head h, sequence s). Columns of S are independent through the whole
// recurrence (δ_j needs only column j), so the dv columns split over blocks with no exchange;
// every block normalises its tokens' q and k itself (dk values each, cheap). Per chunk of
// kChunk tokens: stage q̂, k̂ (fp32), this tile's v, β and decay in shared memory, barrier, then
// each warp runs the recurrence over the chunk on its own 8 columns with only warp shuffles.
// Sequences of run_limit tokens or more are left to the chunked kernel.
template <int kDk, int kChunk>
__global__ void __launch_bounds__(kRuleWarps * 32)
    gated_delta_rule_kernel(GatedDeltaRuleParams p, float q_scale, int run_limit) {
  pdl_sync();
  constexpr int kRows = kDk / kRuleParts;  // rows of S per thread
  constexpr int kPerLane = kDk / 32;       // q/k values per lane when normalising
  // partial sums per dot product: a long prompt runs one block per SM, so the per-token chain
  // (Sᵀk → δ → update and Sᵀq) is latency-bound and wants the ILP; decode is bound by the state
  // load and keeps its registers
  constexpr int kAcc = kChunk > 1 ? 4 : 1;
  __shared__ float qk_s[kChunk][2][kDk];  // [token][q, k][i]
  __shared__ float v_s[kChunk][kRuleCols];
  __shared__ float beta_s[kChunk], decay_s[kChunk];

  const GdnDims& d = p.dims;
  const int s = blockIdx.z, h = blockIdx.y, col0 = blockIdx.x * kRuleCols;
  const int t0 = p.seqs.q_start[s], len = p.seqs.q_start[s + 1] - t0;
  if (len <= 0 || len >= run_limit) return;  // uniform over the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = lane / kRuleWarpCols, wcol = warp * kRuleWarpCols + lane % kRuleWarpCols;
  const int col = col0 + wcol;
  const int r = d.nv / d.nk, kh = h / r, C = conv_dim(d);
  const int64_t ba_col = gdn::gate_col(d, h);
  const int slot = p.seqs.state_slots[s];
  const bool fresh = fresh_state(p.seqs, t0, slot);
  float* S =
      slot >= 0 ? p.ssm_state + (static_cast<size_t>(slot) * d.nv + h) * kDk * d.dv : nullptr;

  float st[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m)
    st[m] = fresh ? 0.f : S[static_cast<size_t>(part + kRuleParts * m) * d.dv + col];
  const float neg_a = -expf(bf(p.a_log[h])), dt_bias = bf(p.dt_bias[h]);

  for (int c0 = 0; c0 < len; c0 += kChunk) {
    const int n = min(kChunk, len - c0);
    const int64_t tok0 = t0 + c0;
    __syncthreads();  // the previous chunk's readers are done
    // q and k: one warp per vector, L2-normalised; q then scaled (the CPU's two steps)
    for (int vi = warp; vi < 2 * n; vi += kRuleWarps) {
      const int tt = vi >> 1, is_k = vi & 1;
      const bf16* src = p.mixed + (tok0 + tt) * C + is_k * d.nk * kDk + kh * kDk;
      float x[kPerLane], ss = 0.f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        x[e] = bf(src[lane + 32 * e]);
        ss += x[e] * x[e];
      }
      const float inv = 1.f / sqrtf(warp_sum(ss) + kL2NormEps);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const float y = x[e] * inv;
        qk_s[tt][is_k][lane + 32 * e] = is_k ? y : y * q_scale;
      }
    }
    for (int i = threadIdx.x; i < n * kRuleCols; i += kRuleWarps * 32) {
      const int tt = i / kRuleCols, cc = i % kRuleCols;
      v_s[tt][cc] = bf(
          p.mixed[(tok0 + tt) * C + 2 * d.nk * kDk + static_cast<int64_t>(h) * d.dv + col0 + cc]);
    }
    if (threadIdx.x < n) {
      const bf16* ba = p.proj + (tok0 + threadIdx.x) * p.proj_stride + ba_col;
      beta_s[threadIdx.x] = 1.f / (1.f + expf(-bf(ba[0])));
      decay_s[threadIdx.x] = expf(neg_a * softplus(bf(ba[r]) + dt_bias));
    }
    __syncthreads();

    for (int tt = 0; tt < n; ++tt) {
      const float* q = qk_s[tt][0];
      const float* k = qk_s[tt][1];
      const float decay = decay_s[tt];
      float ua[kAcc] = {}, oa[kAcc] = {};
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        st[m] *= decay;
        ua[m % kAcc] = fmaf(st[m], k[part + kRuleParts * m], ua[m % kAcc]);
      }
      float u = sum(ua);  // (Sᵀk)_col after the decay, over this part's rows
      // sum over the 4 parts (lanes xor 8, 16): every part gets the same bits, so all update
      // their rows with the same δ
      u += __shfl_xor_sync(kFullMask, u, 8);
      u += __shfl_xor_sync(kFullMask, u, 16);
      const float delta = (v_s[tt][wcol] - u) * beta_s[tt];
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        st[m] = fmaf(k[part + kRuleParts * m], delta, st[m]);
        oa[m % kAcc] = fmaf(st[m], q[part + kRuleParts * m], oa[m % kAcc]);
      }
      float o = sum(oa);
      o += __shfl_xor_sync(kFullMask, o, 8);
      o += __shfl_xor_sync(kFullMask, o, 16);
      if (part == 0)
        p.out[(tok0 + tt) * d.nv * d.dv + static_cast<int64_t>(h) * d.dv + col] =
            __float2bfloat16(o);
    }
  }
  if (S != nullptr) {
#pragma unroll
    for (int m = 0; m < kRows; ++m)
      S[static_cast<size_t>(part + kRuleParts * m) * d.dv + col] = st[m];
  }
}

// --- gated RMSNorm --------------------------------------------------------------------------

// One warp per (token, value head); lane owns elements lane + 32e of the head (dv ≤ 256).
__global__ void __launch_bounds__(kNormWarps * 32) gated_rmsnorm_kernel(GatedRmsNormParams p) {
  pdl_sync();
  constexpr int kMaxPerLane = 8;
  const GdnDims& d = p.dims;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (row >= static_cast<int64_t>(p.num_tokens) * d.nv) return;
  const int lane = threadIdx.x & 31, per_lane = d.dv / 32;
  const int64_t t = row / d.nv;
  const int h = static_cast<int>(row % d.nv), r = d.nv / d.nk;
  const bf16* o = p.o + row * d.dv;  // [tokens, nv·dv]: row (t, h) starts at (t·nv + h)·dv
  const bf16* z = p.proj + t * p.proj_stride +
                  static_cast<int64_t>(h / r) * (2 * d.dk + 2 * r * d.dv) + 2 * d.dk + r * d.dv +
                  (h % r) * d.dv;
  float x[kMaxPerLane], ss = 0.f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    x[e] = e < per_lane ? bf(o[lane + 32 * e]) : 0.f;
    ss += x[e] * x[e];
  }
  const float inv = 1.f / sqrtf(warp_sum(ss) / d.dv + p.eps);
  bf16* out = p.out + row * d.dv;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    if (e >= per_lane) break;
    const int j = lane + 32 * e;
    out[j] = __float2bfloat16(x[e] * inv * bf(p.weight[j]) * silu(bf(z[j])));
  }
}

// --- launchers ------------------------------------------------------------------------------

void check_dims(const GdnDims& d, const char* op) {
  MB_CHECK(d.nk > 0 && d.nv > 0 && d.nv % d.nk == 0,
           std::string(op) + ": nv must be a positive multiple of nk");
  MB_CHECK(d.dk == 32 || d.dk == 64 || d.dk == 128, std::string(op) + ": dk must be 32, 64 or 128");
  MB_CHECK(d.dv > 0 && d.dv % 32 == 0 && d.dv <= 256,
           std::string(op) + ": dv must be a multiple of 32, at most 256");
}

int64_t proj_width(const GdnDims& d) {
  const int64_t r = d.nv / d.nk;
  return d.nk * (2 * d.dk + 2 * r * d.dv) + 2 * d.nv;
}

void check_seqs(const GdnSeqs& s, const char* op) {
  MB_CHECK(s.num_seqs >= 0 && s.num_seqs <= 65535,
           std::string(op) + ": num_seqs must be in [0, 65535]");
  MB_CHECK(s.num_seqs == 0 || (s.q_start && s.positions && s.state_slots),
           std::string(op) + ": null sequence array");
}

void check_conv(const CausalConvParams& p, const char* op) {
  check_dims(p.dims, op);
  check_seqs(p.seqs, op);
  MB_CHECK(p.dims.conv_kernel >= 2 && p.dims.conv_kernel <= kMaxConvKernel,
           std::string(op) + ": conv_kernel must be in [2, 8]");
  MB_CHECK(p.proj_stride >= proj_width(p.dims),
           std::string(op) + ": proj_stride is narrower than the proj row");
  MB_CHECK(p.out && p.proj && p.weight && p.conv_state, std::string(op) + ": null operand");
}

template <int K>
void launch_conv(const CausalConvParams& p, bool decode, cudaStream_t stream) {
  const int C = conv_dim(p.dims);
  if (decode) {
    launch_dependent(causal_conv_decode_kernel<K>,
                     dim3(CEIL_DIV(C, kConvDecodeThreads), p.seqs.num_seqs), kConvDecodeThreads, 0,
                     stream, p);
  } else {
    launch_dependent(causal_conv_prefill_kernel<K>,
                     dim3(CEIL_DIV(C, kConvChannels), p.seqs.num_seqs),
                     dim3(kConvChannels, kConvRows), 0, stream, p);
  }
  CUDA_CHECK_LAST();
}

// conv_kernel was checked to lie in [2, kMaxConvKernel].
void causal_conv(const CausalConvParams& p, bool decode, cudaStream_t stream) {
  switch (p.dims.conv_kernel) {
    case 2:
      return launch_conv<2>(p, decode, stream);
    case 3:
      return launch_conv<3>(p, decode, stream);
    case 4:
      return launch_conv<4>(p, decode, stream);
    case 5:
      return launch_conv<5>(p, decode, stream);
    case 6:
      return launch_conv<6>(p, decode, stream);
    case 7:
      return launch_conv<7>(p, decode, stream);
    case 8:
      return launch_conv<8>(p, decode, stream);
  }
}

void check_rule(const GatedDeltaRuleParams& p, const char* op) {
  check_dims(p.dims, op);
  check_seqs(p.seqs, op);
  MB_CHECK(p.proj_stride >= proj_width(p.dims),
           std::string(op) + ": proj_stride is narrower than the proj row");
  MB_CHECK(p.out && p.mixed && p.proj && p.a_log && p.dt_bias && p.ssm_state,
           std::string(op) + ": null operand");
}

// The recurrent kernel over the sequences shorter than run_limit tokens.
template <int kChunk>
void launch_rule(const GatedDeltaRuleParams& p, int run_limit, cudaStream_t stream) {
  const float q_scale = gdn::q_scale(p.dims.dk);
  const dim3 grid(p.dims.dv / kRuleCols, p.dims.nv, p.seqs.num_seqs);
  switch (p.dims.dk) {
    case 32:
      launch_dependent(gated_delta_rule_kernel<32, kChunk>, grid, kRuleWarps * 32, 0, stream, p,
                       q_scale, run_limit);
      break;
    case 64:
      launch_dependent(gated_delta_rule_kernel<64, kChunk>, grid, kRuleWarps * 32, 0, stream, p,
                       q_scale, run_limit);
      break;
    case 128:
      launch_dependent(gated_delta_rule_kernel<128, kChunk>, grid, kRuleWarps * 32, 0, stream, p,
                       q_scale, run_limit);
      break;
  }
  CUDA_CHECK_LAST();
}

}  // namespace

void causal_conv_decode(const CausalConvParams& p, cudaStream_t stream) {
  check_conv(p, "causal_conv_decode");
  if (p.seqs.num_seqs == 0) return;
  causal_conv(p, true, stream);
}

void causal_conv_prefill(const CausalConvParams& p, cudaStream_t stream) {
  check_conv(p, "causal_conv_prefill");
  if (p.seqs.num_seqs == 0) return;
  causal_conv(p, false, stream);
}

void gated_delta_rule_decode(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  check_rule(p, "gated_delta_rule_decode");
  if (p.seqs.num_seqs == 0) return;
  launch_rule<1>(p, INT_MAX, stream);
}

// The one place the form is picked. The run lengths are on the device, so by_length launches
// both kernels and each block keeps or leaves its sequence by gdn::kChunkedMinRun (the why is
// there): a left block exits at once, and the two touch disjoint sequences and slots.
void gated_delta_rule_prefill(const GatedDeltaRuleParams& p, cudaStream_t stream,
                              DeltaRuleForm form) {
  check_rule(p, "gated_delta_rule_prefill");
  if (p.seqs.num_seqs == 0) return;
  if (form == DeltaRuleForm::recurrent ||
      (form == DeltaRuleForm::by_length && !gdn::chunked_supports(p))) {
    launch_rule<kRuleChunk>(p, INT_MAX, stream);
  } else if (form == DeltaRuleForm::chunked) {
    gdn::launch_chunked(p, 1, stream);
  } else {
    launch_rule<kRuleChunk>(p, gdn::kChunkedMinRun, stream);
    gdn::launch_chunked(p, gdn::kChunkedMinRun, stream);
  }
}

void gated_rmsnorm(const GatedRmsNormParams& p, cudaStream_t stream) {
  check_dims(p.dims, "gated_rmsnorm");
  MB_CHECK(p.num_tokens >= 0, "gated_rmsnorm: num_tokens must be >= 0");
  MB_CHECK(p.proj_stride >= proj_width(p.dims),
           "gated_rmsnorm: proj_stride is narrower than the proj row");
  MB_CHECK(p.out && p.o && p.proj && p.weight, "gated_rmsnorm: null operand");
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.dims.nv;
  if (rows == 0) return;
  launch_dependent(gated_rmsnorm_kernel, static_cast<unsigned>(CEIL_DIV(rows, kNormWarps)),
                   kNormWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
