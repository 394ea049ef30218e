// The gated delta rule in chunked form (the Gated DeltaNet paper's WY / UT transform, as in
// flash-linear-attention's chunk_gated_delta_rule) for long prefill runs, on tensor cores.
// Contract: kernels/linear_attention.cuh; the form is picked in gated_delta_rule_prefill.
//
// A chunk of n ≤ 64 tokens t (row t of Q, K, V; padded to 64 with zero q, k, v, β and log decay)
// with Γ_t = Σ_{u≤t} g_u the log decay since the chunk's start and S₀ the state before it:
//   A_ts = β_t e^{Γt−Γs} k_t·k_s (s < t)        R = diag(β) (V − diag(e^Γ) K S₀)
//   (I + A) V' = R  (forward substitution)      V' holds the tokens' δ
//   O = diag(e^Γ) Q S₀ + (Q Kᵀ ∘ e^{Γt−Γs} [s ≤ t]) V'
//   S = e^{Γlast} S₀ + Kᵀ diag(e^{Γlast−Γt}) V'
// which is the recurrence, token by token, rewritten (δ_t = β_t (v_t − e^{Γt} S₀ᵀk_t −
// Σ_{s<t} e^{Γt−Γs} (k_t·k_s) δ_s)). FLA's W = T diag(βe^Γ) K and U = T diag(β) V with
// T = (I + A)⁻¹ give V' = U − W S₀ = T R: this kernel solves for V' = T R directly, which
// needs neither T nor the 64 × dk product W. Decay ratios are e^{Γt−Γs} with Γ summed in
// double: a difference of two fp32 prefix sums near −300 would lose ~3e-5 of every ratio.
//
// Precision: every product is bf16x3 on mma.sync m16n8k16 (x = hi + lo, hi = bf16(x),
// lo = bf16(x − hi); x·y ≈ hi·hi + hi·lo + lo·hi, fp32 accumulation): each operand is kept to
// ~2^-17 relative, about fp32's. A host model of this kernel's arithmetic against the fp64
// recurrence (Qwen3-Next-80B dims, 300 tokens, continuing states) gives the state 4.8e-6 and
// o 1.7e-3 — o's own bf16 rounding; with plain bf16 operands in the products that feed the
// state it gives the state 2.5e-3, with tf32 3.1e-4, both over its 1e-4 tolerance; with the
// o-only products (Q S₀, Q Kᵀ, P V') at two terms o is 2.8e-3, at one 3.6e-3 of its 5e-3, so
// they keep three as well. The solve, the decays and the state between chunks are fp32.
//
// A block per (64 columns of S, value head, sequence). S's columns are independent through the
// recurrence and the chunk's A and Q Kᵀ are dv-independent, so a tile recomputes those two
// (dk·64² each) and nothing else: at dv 128 two blocks per head, for the single long prompt
// 64 blocks instead of 32, at ~1/4 more MMAs than whole heads. 8 warps; per chunk four phases
// behind barriers: stage (q̂, k̂ split hi/lo, v, β, Γ) → products on S₀ and K (A, Q Kᵀ, R, Q S₀)
// → the solve → P V' (into o) and the state update. The state lives in registers (fp32
// fragments, 32 per thread at dk 128) for the whole sequence; its hi/lo copy in shared memory
// feeds the next chunk's products.
#include <cstdint>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gated_delta_chunked.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"

namespace moebatch::kernels::gdn {
namespace {

constexpr int kC = 64;   // tokens per chunk
constexpr int kNv = 64;  // columns of S per block
constexpr int kWarps = 8, kThreads = kWarps * 32;
// Shared rows padded by 16 bytes so the 8 row addresses of an ldmatrix phase fall in distinct
// 16-byte bank groups (row pitch ≡ 16 mod 128 bytes): bf16 rows of 64 (tokens or S columns).
constexpr int kPad64 = 64 + 8;
constexpr int kPadA = kC + 4;   // fp32 Aᵀ rows: the epilogue's column stores hit 32 banks
constexpr int kPadR = kNv + 8;  // fp32 R rows: the solve's 4 row parts hit distinct banks
static_assert(kThreads == kNv * 4, "the solve runs 4 threads per column of V'");
static_assert(kC == 64 && kNv == 64, "the phases' warp maps assume 64 × 64 tiles");

// Shared memory of one block (element offsets within their type's region; regions in this
// order, each 16-byte aligned): Γ (double), then fp32, then bf16.
template <int kDk>
struct Smem {
  static constexpr int kPadK = kDk + 8;      // q, k rows
  static constexpr int kQk = kC * kPadK;     // one of q hi, q lo, k hi, k lo [t][i]
  static constexpr int kS = kDk * kPad64;    // S₀ hi or lo [i][j]
  static constexpr int kTile = kC * kPad64;  // [t][j] or [t][s]: v, P, V', Ṽ hi / lo
  static constexpr int kF32 = kC * kPadA + kC * kPadR + 3 * kC;  // Aᵀ, R, β, e^Γ, e^{Γlast−Γ}
  static constexpr int kBf16 = 4 * kQk + 2 * kS + 7 * kTile;
  static constexpr size_t kBytes =
      kC * sizeof(double) + kF32 * sizeof(float) + kBf16 * sizeof(bf16);
};


// Fragment loads (PTX ISA layouts, lane = 4g + t: A a0 (row g, k 2t..2t+1), a1 (row g + 8),
// a2 (k + 8), a3 (both); B b0 (k 2t..2t+1, col g), b1 (k + 8)) from row-major bf16 tiles.
// A 16 × 16 of M at (row0, k0).
__device__ __forceinline__ void load_a(unsigned r[4], const bf16* m, int pitch, int row0, int k0,
                                       int lane) {
  ldmatrix_x4(smem_addr(m + (row0 + (lane & 15)) * pitch + k0 + (lane >> 4) * 8), r);
}
// A 16 × 16 of Mᵀ (A[r][k] = M[k][r]) at (row0, k0): M rows k0.., columns row0...
__device__ __forceinline__ void load_a_t(unsigned r[4], const bf16* m, int pitch, int row0, int k0,
                                         int lane) {
  ldmatrix_x4_trans(
      smem_addr(m + (k0 + (lane & 7) + (lane >> 4) * 8) * pitch + row0 + ((lane >> 3) & 1) * 8), r);
}
// B k16 × n16 (two n8 tiles: r[0..1] columns n0.., r[2..3] n0 + 8..) where M = Bᵀ, i.e.
// B[k][n] = M[n][k].
__device__ __forceinline__ void load_b_nk(unsigned r[4], const bf16* m, int pitch, int k0, int n0,
                                          int lane) {
  ldmatrix_x4(
      smem_addr(m + (n0 + (lane & 7) + (lane >> 4) * 8) * pitch + k0 + ((lane >> 3) & 1) * 8), r);
}
// The same from M = B (B[k][n] = M[k][n]).
__device__ __forceinline__ void load_b_kn(unsigned r[4], const bf16* m, int pitch, int k0, int n0,
                                          int lane) {
  ldmatrix_x4_trans(
      smem_addr(m + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8), r);
}

// c += a·b in bf16x3: the two small cross terms first.
__device__ __forceinline__ void mma3(float c[4], const unsigned ah[4], const unsigned al[4],
                                     const unsigned* bh, const unsigned* bl) {
  mma_bf16_16816(c, al[0], al[1], al[2], al[3], bh[0], bh[1]);
  mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
  mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
}

// Stores x0, x1 at hi[off], hi[off + 1] as bf16 and their remainders at lo (off even).
__device__ __forceinline__ void store_split2(bf16* hi, bf16* lo, int off, float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  *reinterpret_cast<__nv_bfloat162*>(hi + off) = h;
  *reinterpret_cast<__nv_bfloat162*>(lo + off) = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
}
__device__ __forceinline__ void store_split(bf16* hi, bf16* lo, int off, float x) {
  const bf16 h = __float2bfloat16_rn(x);
  hi[off] = h;
  lo[off] = __float2bfloat16_rn(x - __bfloat162float(h));
}

// Block (64-column tile, value head h, sequence s); sequences shorter than min_len are the
// recurrent kernel's. Warp roles: o and the products over tokens (X = K S₀, Q S₀, P V') take
// token rows 16·(warp / 2).. and value columns 32·(warp % 2)..; A and Q Kᵀ the 16 × 16 blocks
// (warp / 2, nb ≤ warp / 2) with nb ≡ warp (mod 2); the state update and the state registers
// take S rows 16·(warp / kWpr).. and kNv / kWpr columns from (warp % kWpr)·kNv / kWpr.
template <int kDk>
__global__ void __launch_bounds__(kThreads, 1)
    gated_delta_chunked_kernel(GatedDeltaRuleParams p, float q_scale, int min_len) {
  pdl_sync();
  using L = Smem<kDk>;
  constexpr int kPadK = L::kPadK;
  constexpr int kWpr = kWarps / (kDk / 16);  // warps per 16 rows of S: 1 (dk 128) or 2 (dk 64)
  constexpr int kSCols = kNv / kWpr;         // S columns per warp
  constexpr int kSTiles = kSCols / 8;
  constexpr int kPer = kDk / 32;  // q/k elements per lane when normalising: 4 or 2
  static_assert(kDk == 64 || kDk == 128, "the chunked form takes dk 64 and 128");

  extern __shared__ __align__(16) unsigned char chunk_smem[];
  double* const gam = reinterpret_cast<double*>(chunk_smem);  // Γ_t
  float* const at = reinterpret_cast<float*>(gam + kC);       // Aᵀ [s][t]
  float* const rr = at + kC * kPadA;                          // R [t][j]
  float* const beta = rr + kC * kPadR;                        // β_t (0 past n)
  float* const eg = beta + kC;                                // e^{Γt}
  float* const eend = eg + kC;                                // e^{Γlast−Γt}
  bf16* const q_hi = reinterpret_cast<bf16*>(eend + kC);
  bf16* const q_lo = q_hi + L::kQk;
  bf16* const k_hi = q_lo + L::kQk;
  bf16* const k_lo = k_hi + L::kQk;
  bf16* const s_hi = k_lo + L::kQk;  // S₀ [i][j]
  bf16* const s_lo = s_hi + L::kS;
  bf16* const v_in = s_lo + L::kS;     // v [t][j] (bf16 inputs: exact)
  bf16* const p_hi = v_in + L::kTile;  // P = Q Kᵀ ∘ decay, causal [t][s]
  bf16* const p_lo = p_hi + L::kTile;
  bf16* const vp_hi = p_lo + L::kTile;  // V' [t][j]
  bf16* const vp_lo = vp_hi + L::kTile;
  bf16* const vt_hi = vp_lo + L::kTile;  // Ṽ = diag(e^{Γlast−Γt}) V' [t][j]
  bf16* const vt_lo = vt_hi + L::kTile;

  const GdnDims& d = p.dims;
  const int s = blockIdx.z, h = blockIdx.y, col0 = blockIdx.x * kNv;
  const int t0 = p.seqs.q_start[s], len = p.seqs.q_start[s + 1] - t0;
  if (len <= 0 || len < min_len) return;  // uniform over the block
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int C = conv_dim(d), kh = h / (d.nv / d.nk);
  const int64_t b_col = gate_col(d, h), a_off = d.nv / d.nk;
  const int slot = p.seqs.state_slots[s];
  const bool fresh = fresh_state(p.seqs, t0, slot);
  float* const S = slot >= 0
                       ? p.ssm_state + (static_cast<size_t>(slot) * d.nv + h) * kDk * d.dv + col0
                       : nullptr;

  const int mb = warp >> 1, oc = (warp & 1) * 32;                    // token rows, o cols
  const int si0 = 16 * (warp / kWpr), sj0 = (warp % kWpr) * kSCols;  // state rows, cols

  // The state: fragment nt holds S[si0 + g (+8)][sj0 + 8nt + 2c (+1)], and its hi/lo copy.
  float st[kSTiles][4];
#pragma unroll
  for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int i = si0 + g + 8 * hr, j = sj0 + 8 * nt + 2 * c;
      float2 v = make_float2(0.f, 0.f);
      if (!fresh) v = *reinterpret_cast<const float2*>(S + static_cast<size_t>(i) * d.dv + j);
      st[nt][2 * hr] = v.x;
      st[nt][2 * hr + 1] = v.y;
      store_split2(s_hi, s_lo, i * kPad64 + j, v.x, v.y);
    }
  }
  const float neg_a = -expf(bf(p.a_log[h])), dt_bias = bf(p.dt_bias[h]);

  for (int c0 = 0; c0 < len; c0 += kC) {
    const int n = min(kC, len - c0);
    const int64_t tok0 = t0 + c0;
    __syncthreads();  // the previous chunk's last phase is done with q, k, P, V', Ṽ and the decays

    // --- stage: β and Γ (warp 0: tokens 2·lane, 2·lane + 1, a warp scan in double); q̂, k̂ (a
    // warp per vector, L2-normalised, q then scaled: the CPU's two steps) split hi/lo; v.
    if (warp == 0) {
      float bt[2], gt[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * lane + e;
        bt[e] = 0.f;
        gt[e] = 0.f;
        if (t < n) {
          const bf16* ba = p.proj + (tok0 + t) * p.proj_stride + b_col;
          bt[e] = 1.f / (1.f + expf(-bf(ba[0])));
          gt[e] = neg_a * softplus(bf(ba[a_off]) + dt_bias);
        }
      }
      double incl = static_cast<double>(gt[0]) + static_cast<double>(gt[1]);
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double up = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += up;
      }
      const double total = __shfl_sync(kFullMask, incl, 31);
      const double gm[2] = {incl - static_cast<double>(gt[1]), incl};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * lane + e;
        gam[t] = gm[e];
        beta[t] = bt[e];
        eg[t] = expf(static_cast<float>(gm[e]));
        eend[t] = expf(static_cast<float>(total - gm[e]));
      }
    }
    for (int vi = warp; vi < 2 * kC; vi += kWarps) {
      const int tt = vi >> 1, is_k = vi & 1;
      float x[kPer], ss = 0.f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) x[e] = 0.f;
      if (tt < n) {  // uniform over the warp
        const bf16* src = p.mixed + (tok0 + tt) * C + is_k * d.nk * kDk + kh * kDk + lane * kPer;
#pragma unroll
        for (int e = 0; e < kPer; e += 2) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src + e));
          x[e] = f.x;
          x[e + 1] = f.y;
          ss += f.x * f.x + f.y * f.y;
        }
      }
      const float inv = 1.f / sqrtf(warp_sum(ss) + kL2NormEps);
      bf16* const hi = (is_k ? k_hi : q_hi) + tt * kPadK + lane * kPer;
      bf16* const lo = (is_k ? k_lo : q_lo) + tt * kPadK + lane * kPer;
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        float y0 = x[e] * inv, y1 = x[e + 1] * inv;
        if (!is_k) {
          y0 *= q_scale;
          y1 *= q_scale;
        }
        store_split2(hi, lo, e, y0, y1);
      }
    }
    for (int i = tid; i < kC * kNv / 8; i += kThreads) {
      const int tt = i / (kNv / 8), ch = (i % (kNv / 8)) * 8;
      uint4 u = make_uint4(0, 0, 0, 0);
      if (tt < n)
        u = *reinterpret_cast<const uint4*>(p.mixed + (tok0 + tt) * C + 2 * d.nk * kDk +
                                            static_cast<int64_t>(h) * d.dv + col0 + ch);
      *reinterpret_cast<uint4*>(v_in + tt * kPad64 + ch) = u;
    }
    __syncthreads();

    // --- products over S₀ and K: X = K S₀ and Q S₀ on this warp's 16 × 32 tile; K Kᵀ and Q Kᵀ
    // on its lower 16 × 16 blocks. The A fragments of K and Q rows serve all four.
    float xa[4][4] = {}, oa[4][4] = {}, ga[2][2][4] = {}, pa[2][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      unsigned akh[4], akl[4], aqh[4], aql[4];
      load_a(akh, k_hi, kPadK, 16 * mb, 16 * kk, lane);
      load_a(akl, k_lo, kPadK, 16 * mb, 16 * kk, lane);
      load_a(aqh, q_hi, kPadK, 16 * mb, 16 * kk, lane);
      load_a(aql, q_lo, kPadK, 16 * mb, 16 * kk, lane);
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        unsigned bh[4], bl[4];
        load_b_kn(bh, s_hi, kPad64, 16 * kk, oc + 16 * q2, lane);
        load_b_kn(bl, s_lo, kPad64, 16 * kk, oc + 16 * q2, lane);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          mma3(xa[2 * q2 + e], akh, akl, bh + 2 * e, bl + 2 * e);
          mma3(oa[2 * q2 + e], aqh, aql, bh + 2 * e, bl + 2 * e);
        }
      }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int nb = (warp & 1) + 2 * b;
        if (nb > mb) break;  // uniform over the warp
        unsigned bh[4], bl[4];
        load_b_nk(bh, k_hi, kPadK, 16 * kk, 16 * nb, lane);
        load_b_nk(bl, k_lo, kPadK, 16 * kk, 16 * nb, lane);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          mma3(ga[b][e], akh, akl, bh + 2 * e, bl + 2 * e);
          mma3(pa[b][e], aqh, aql, bh + 2 * e, bl + 2 * e);
        }
      }
    }
    // R = β (v − e^Γ X) for the solve; o starts as e^Γ Q S₀ (kept in registers).
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int t = 16 * mb + g + 8 * hr, j = oc + 8 * nt + 2 * c;
        const float e = eg[t], b = beta[t];
        const float2 v =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_in + t * kPad64 + j));
        *reinterpret_cast<float2*>(rr + t * kPadR + j) =
            make_float2(b * (v.x - e * xa[nt][2 * hr]), b * (v.y - e * xa[nt][2 * hr + 1]));
        oa[nt][2 * hr] *= e;
        oa[nt][2 * hr + 1] *= e;
      }
    }
    // Aᵀ (strictly lower A: the solve reads nothing else) and P (causal, zero above the diagonal
    // of its diagonal blocks; blocks above are never read).
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int nb = (warp & 1) + 2 * b;
      if (nb > mb) break;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int t = 16 * mb + g + 8 * hr, s0 = 16 * nb + 8 * e + 2 * c;
          float pv[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int sc = s0 + u;
            // decay ratios only where s ≤ t: above the diagonal e^{Γt−Γs} may overflow
            const float ratio = sc <= t ? expf(static_cast<float>(gam[t] - gam[sc])) : 0.f;
            if (sc < t) at[sc * kPadA + t] = beta[t] * ratio * ga[b][e][2 * hr + u];
            pv[u] = ratio * pa[b][e][2 * hr + u];
          }
          store_split2(p_hi, p_lo, t * kPad64 + s0, pv[0], pv[1]);
        }
      }
    }
    __syncthreads();

    // --- the solve (I + A) V' = R, fp32: thread (column j, part) owns rows 4m + part of column
    // j; at step s the owner of row s (final by then) hands it to the column's 4 threads by a
    // shuffle and each subtracts A_ts v'_s from its later rows. The parts hit 4 consecutive
    // words of Aᵀ's row s (8 columns share them: broadcasts).
    {
      const int j = tid >> 2, part = tid & 3;
      float acc[kC / 4];
#pragma unroll
      for (int m = 0; m < kC / 4; ++m) acc[m] = rr[(4 * m + part) * kPadR + j];
#pragma unroll
      for (int s_ = 0; s_ < kC; ++s_) {
        const int ms = s_ >> 2;
        const float v = __shfl_sync(kFullMask, acc[ms], (lane & ~3) | (s_ & 3));
        const float* a_s = at + s_ * kPadA + part;
        if (part > (s_ & 3)) acc[ms] = fmaf(-a_s[4 * ms], v, acc[ms]);
#pragma unroll
        for (int m = ms + 1; m < kC / 4; ++m) acc[m] = fmaf(-a_s[4 * m], v, acc[m]);
      }
#pragma unroll
      for (int m = 0; m < kC / 4; ++m) {
        const int t = 4 * m + part;
        store_split(vp_hi, vp_lo, t * kPad64 + j, acc[m]);
        store_split(vt_hi, vt_lo, t * kPad64 + j, eend[t] * acc[m]);
      }
    }
    __syncthreads();

    // --- o += P V' (P is zero past the diagonal block), written for the chunk's n tokens
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      if (kb > mb) break;  // uniform over the warp
      unsigned aph[4], apl[4];
      load_a(aph, p_hi, kPad64, 16 * mb, 16 * kb, lane);
      load_a(apl, p_lo, kPad64, 16 * mb, 16 * kb, lane);
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        unsigned bh[4], bl[4];
        load_b_kn(bh, vp_hi, kPad64, 16 * kb, oc + 16 * q2, lane);
        load_b_kn(bl, vp_lo, kPad64, 16 * kb, oc + 16 * q2, lane);
#pragma unroll
        for (int e = 0; e < 2; ++e) mma3(oa[2 * q2 + e], aph, apl, bh + 2 * e, bl + 2 * e);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int t = 16 * mb + g + 8 * hr;
        if (t >= n) continue;
        bf16* const o = p.out + (tok0 + t) * d.nv * d.dv + static_cast<int64_t>(h) * d.dv + col0 +
                        oc + 8 * nt + 2 * c;
        *reinterpret_cast<__nv_bfloat162*>(o) =
            __floats2bfloat162_rn(oa[nt][2 * hr], oa[nt][2 * hr + 1]);
      }
    }

    // --- the state: S = e^{Γlast} S₀ + Kᵀ Ṽ on this warp's rows and columns
    const float e_last = eg[kC - 1];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] *= e_last;
    }
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      unsigned akh[4], akl[4];
      load_a_t(akh, k_hi, kPadK, si0, 16 * kk, lane);
      load_a_t(akl, k_lo, kPadK, si0, 16 * kk, lane);
#pragma unroll
      for (int q2 = 0; q2 < kSTiles / 2; ++q2) {
        unsigned bh[4], bl[4];
        load_b_kn(bh, vt_hi, kPad64, 16 * kk, sj0 + 16 * q2, lane);
        load_b_kn(bl, vt_lo, kPad64, 16 * kk, sj0 + 16 * q2, lane);
#pragma unroll
        for (int e = 0; e < 2; ++e) mma3(st[2 * q2 + e], akh, akl, bh + 2 * e, bl + 2 * e);
      }
    }
    if (c0 + kC < len) {  // S₀ of the next chunk (the current one's readers passed a barrier)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          store_split2(s_hi, s_lo, (si0 + g + 8 * hr) * kPad64 + sj0 + 8 * nt + 2 * c,
                       st[nt][2 * hr], st[nt][2 * hr + 1]);
      }
    }
  }

  if (S != nullptr) {
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = si0 + g + 8 * hr, j = sj0 + 8 * nt + 2 * c;
        *reinterpret_cast<float2*>(S + static_cast<size_t>(i) * d.dv + j) =
            make_float2(st[nt][2 * hr], st[nt][2 * hr + 1]);
      }
    }
  }
}

// --- launcher -------------------------------------------------------------------------------

template <int kDk>
void launch(const GatedDeltaRuleParams& p, int min_len, cudaStream_t stream) {
  // above the 48 KB default (dk 128: 203 KB, dk 64: 153 KB); set per launch, as attributes are
  // per device
  const auto kernel = gated_delta_chunked_kernel<kDk>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Smem<kDk>::kBytes)));
  const dim3 grid(p.dims.dv / kNv, p.dims.nv, p.seqs.num_seqs);
  launch_dependent(kernel, grid, kThreads, Smem<kDk>::kBytes, stream, p, q_scale(kDk), min_len);
  CUDA_CHECK_LAST();
}

}  // namespace

bool chunked_supports(const GatedDeltaRuleParams& p) {
  const GdnDims& d = p.dims;
  return (d.dk == 64 || d.dk == 128) && d.dv % kNv == 0 && aligned16(p.mixed) && aligned16(p.out) &&
         aligned16(p.ssm_state);
}

void launch_chunked(const GatedDeltaRuleParams& p, int min_len, cudaStream_t stream) {
  MB_CHECK(chunked_supports(p),
           "gated_delta_rule (chunked): needs dk 64 or 128, dv % 64 == 0 "
           "and 16-byte aligned mixed, out and ssm_state");
  if (p.dims.dk == 128)
    launch<128>(p, min_len, stream);
  else
    launch<64>(p, min_len, stream);
}

}  // namespace moebatch::kernels::gdn
