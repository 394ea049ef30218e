#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/moe_gemm.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;

// k elements per pipeline stage and token tiles of 8 held in registers at once, the same for
// every codec. Measured on H200 (bench/RESULTS.md, 2026-12-01): chunks of 512 fp8 / 1024 fp4
// inputs (the bf16 stage's bytes) with fewer tiles per pass left batch 1 unchanged and made batch
// 64 / 256 slower (more passes re-decode the weights), so a compressed stage moves fewer bytes.
template <WeightCodec C>
constexpr int kChunk = 256;
template <WeightCodec C>
constexpr int kTilesPerPass = 4;
template <WeightCodec C>
constexpr int kPassRows = kTilesPerPass<C> * kMoeGemmTileM;
template <WeightCodec C>
constexpr int kSteps = kChunk<C> / 32;  // 32-wide k steps per chunk (two MMAs each)

// 32-wide k steps per 16-byte weight granule: 1 (bf16), 2 (fp8, int8), 4 (nvfp4, int4). A window of 32·G k
// is one granule per lane t (k [t·8G, t·8G + 8G) of the window) for each of its two A rows.
template <WeightCodec C>
constexpr int kGranuleSteps = codec_granule(C) / 8;

// Activation rows in shared memory, padded so that the 16-byte B-fragment reads of a quarter warp
// (rows g, g + 1, lanes t = 0..3) fall in distinct bank groups. Row stride in 16-byte vectors:
// bf16 reads vector 4s + t (stride 36 ≡ 4 mod 8 separates the rows); 8-bit codecs read
// 8w + 2t + s' and 4-bit ones 16w + 4t + s' (stride 33 ≡ 1 mod 8, and 4-bit swizzles, see xs_vec).
template <WeightCodec C>
constexpr int kChunkPad = kChunk<C> + (C == WeightCodec::Bf16 ? 32 : 8);

// Shared-memory slot of activation vector v (8 k) of a chunk row. 4-bit lanes t and t + 2 read
// vectors 8 apart (the same banks): vectors with bit 3 set swap pairs (bit 1), which makes the
// quarter-warp's eight reads hit eight distinct bank groups for every s'.
template <WeightCodec C>
__device__ __forceinline__ int xs_vec(int v) {
  if constexpr (codec_is_4bit(C)) return v ^ ((v >> 2) & 2);
  return v;
}

// Scales a granule needs, loaded with it: none (bf16); the fp32 block scale of rows g and g + 8
// (fp8); the two E4M3 group-scale bytes of each row, low byte for inputs 0–15 (nvfp4); the fp32
// group scale and min of each row (int8, int4: a granule lies inside one group).
template <WeightCodec C>
struct GranuleScales {};
template <>
struct GranuleScales<WeightCodec::Fp8Block> {
  float a, b;
};
template <>
struct GranuleScales<WeightCodec::Nvfp4> {
  unsigned a, b;
};
struct IntGranuleScales {
  float a, b, ma, mb;
};
template <>
struct GranuleScales<WeightCodec::Int8> : IntGranuleScales {};
template <>
struct GranuleScales<WeightCodec::Int4> : IntGranuleScales {};

// One chunk of a warp's two weight rows (A rows g and g + 8): lane t's raw 16-byte granule of
// each row in every window of the chunk, decoded only right before its MMAs. bf16: 64
// registers per chunk; fp8: 32 + 8 scales; nvfp4: 16 + 4 scales.
template <WeightCodec C>
struct WeightChunk {
  static constexpr int kGranules = kSteps<C> / kGranuleSteps<C>;
  uint4 a[kGranules];
  uint4 b[kGranules];
  GranuleScales<C> s[kGranules];
};

struct PassState {
  const unsigned char* w0;  // first byte of the weight row of A rows g
  const unsigned char* w1;  // first byte of the weight row of A rows g + 8
  const void* s0;           // scales of those rows (fp8, int: f32, nvfp4: e4m3 bytes; bf16: unused)
  const void* s1;
  const float* m0;          // int8 / int4 group mins of those rows (null: none)
  const float* m1;
  bool warp_active;
  int tiles;
  int nchunks;
};

// The 16-byte granule of a row starting at input kc + kwin + klane (chunk, window, lane).
template <WeightCodec C>
__device__ __forceinline__ uint4 load_granule(const unsigned char* row, int kc, int kwin, int klane) {
  if constexpr (C == WeightCodec::Bf16)
    return *reinterpret_cast<const uint4*>(reinterpret_cast<const bf16*>(row) + kc + kwin + klane);
  if constexpr (codec_is_8bit(C)) return *reinterpret_cast<const uint4*>(row + kc + kwin + klane);
  return *reinterpret_cast<const uint4*>(row + (kc + kwin + klane) / 2);
}

// Weights (and scales) of the chunk at kc with kw valid k into w. Granules past k (the tail
// window of a compressed codec) and an idle warp's are zeros with scale 0, so they add 0.
template <WeightCodec C>
__device__ __forceinline__ void load_weights(const MoeGemmParams& p, const PassState& st, int kc, int kw,
                                             WeightChunk<C>& w) {
  constexpr int G = kGranuleSteps<C>;
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < WeightChunk<C>::kGranules; ++j) {
    const int kwin = j * 32 * G, klane = t * 8 * G;  // the granule's first input: kc + kwin + klane
    // bf16: kw % 32 == 0, so a lane's granule is inside k exactly when its window is
    const bool inside = (G == 1 ? kwin : kwin + klane) < kw;
    if (st.warp_active && inside) {
      w.a[j] = load_granule<C>(st.w0, kc, kwin, klane);
      w.b[j] = load_granule<C>(st.w1, kc, kwin, klane);
      if constexpr (C == WeightCodec::Fp8Block) {
        const int blk = (kc + kwin + klane) / p.weight.group;  // a granule never straddles a block
        w.s[j].a = static_cast<const float*>(st.s0)[blk];
        w.s[j].b = static_cast<const float*>(st.s1)[blk];
      } else if constexpr (C == WeightCodec::Nvfp4) {
        const int pair = (kc + kwin + klane) / 32;  // group scales 2·pair, 2·pair + 1 as one 2-byte load
        w.s[j].a = static_cast<const unsigned short*>(st.s0)[pair];
        w.s[j].b = static_cast<const unsigned short*>(st.s1)[pair];
      } else if constexpr (C == WeightCodec::Int8 || C == WeightCodec::Int4) {
        const int grp = (kc + kwin + klane) / p.weight.group;
        w.s[j].a = static_cast<const float*>(st.s0)[grp];
        w.s[j].b = static_cast<const float*>(st.s1)[grp];
        w.s[j].ma = st.m0 ? st.m0[grp] : 0.f;
        w.s[j].mb = st.m1 ? st.m1[grp] : 0.f;
      }
    } else {
      w.a[j] = w.b[j] = make_uint4(0, 0, 0, 0);
      if constexpr (C != WeightCodec::Bf16) w.s[j] = {};
    }
  }
}

// Activations of the chunk at kc (kw valid k) of the pass's rows into x by cp.async. Padding
// rows get zeros. Compressed codecs multiply whole windows, so the columns past k up to the
// window end are zero-filled too: stale shared memory may hold NaN, and 0 · NaN = NaN.
template <WeightCodec C>
__device__ __forceinline__ void copy_activations(const MoeGemmParams& p, const PassState& st, const int* src_row,
                                                 bf16 (*x)[kChunkPad<C>], int kc, int kw) {
  constexpr int G = kGranuleSteps<C>;
  const int vecs = kw / 8;
  const int fill = G == 1 ? vecs : (kw + 32 * G - 1) / (32 * G) * (4 * G);
  for (int idx = threadIdx.x; idx < st.tiles * kMoeGemmTileM * fill; idx += blockDim.x) {
    const int r = idx / fill, v = idx % fill;
    const int src = src_row[r];
    const bool copy = src >= 0 && (G == 1 || v < vecs);
    const bf16* from = copy ? p.in + static_cast<size_t>(src) * p.k + kc + v * 8 : p.in;
    cp_async16(&x[r][xs_vec<C>(v) * 8], from, copy ? 16 : 0);
  }
}

// W8A8 (MoeGemmParams::in_fp8): a chunk's e4m3 activation rows sit in the same shared buffer as
// bytes, kA8Pitch apart, and their scales (one per 128 inputs) beside them. A lane reads the
// 16 bytes of its k range of a window: the 8 lanes of a quarter warp (rows g, g + 1, lanes t)
// cover 64 bytes of one row and 64 of the next, and a pitch of 64 mod 128 bytes puts the two
// rows on different banks.
constexpr int kA8Pitch = 256 + 64;
constexpr int kA8Group = kMoeGemmA8Group;
constexpr int kA8Groups = 256 / kA8Group;  // per chunk
static_assert(kA8Pitch <= kChunkPad<WeightCodec::Fp8Block> * 2, "an e4m3 row fits the bf16 row's bytes");

__device__ __forceinline__ uint8_t* a8_row(bf16 (*x)[kChunkPad<WeightCodec::Fp8Block>], int r) {
  return reinterpret_cast<uint8_t*>(&x[0][0]) + r * kA8Pitch;
}

// The e4m3 activations and scales of the chunk at kc (kw valid k, a multiple of 128) of the
// pass's rows: bytes by cp.async, scales by plain loads (both ordered by the step's barrier).
// Padding rows and groups past k get zeros and scale 0.
__device__ __forceinline__ void copy_activations_a8(const MoeGemmParams& p, const PassState& st, const int* src_row,
                                                    bf16 (*x)[kChunkPad<WeightCodec::Fp8Block>],
                                                    float (*xscale)[kA8Groups], int kc, int kw) {
  constexpr int kVecs = 256 / 16;
  for (int idx = threadIdx.x; idx < st.tiles * kMoeGemmTileM * kVecs; idx += blockDim.x) {
    const int r = idx / kVecs, v = idx % kVecs;
    const int src = src_row[r];
    const bool copy = src >= 0 && v * 16 < kw;
    const uint8_t* from = copy ? p.in_fp8 + static_cast<size_t>(src) * p.k + kc + v * 16 : p.in_fp8;
    cp_async16(a8_row(x, r) + v * 16, from, copy ? 16 : 0);
  }
  const int groups = p.k / kA8Group;
  for (int idx = threadIdx.x; idx < st.tiles * kMoeGemmTileM * kA8Groups; idx += blockDim.x) {
    const int r = idx / kA8Groups, gi = idx % kA8Groups;
    const int src = src_row[r];
    xscale[r][gi] = src >= 0 && gi * kA8Group < kw ? p.in_scales[static_cast<size_t>(src) * groups + kc / kA8Group + gi] : 0.f;
  }
}

// Chunk c's products of one W8A8 step (see pipeline_step): per 64-wide window the lane's raw
// weight granules are the A fragments of two e4m3 MMAs (bytes 0–7 of its 16 inputs, then 8–15,
// the activations' k permuted alike), and the window's sums enter the accumulators scaled by the
// weight rows' and the tokens' scales.
__device__ __forceinline__ void multiply_chunk_a8(const PassState& st, bf16 (*x)[kChunkPad<WeightCodec::Fp8Block>],
                                                  const float (*xscale)[kA8Groups],
                                                  float (&acc)[kTilesPerPass<WeightCodec::Fp8Block>][4],
                                                  const WeightChunk<WeightCodec::Fp8Block>& w, int kw) {
  constexpr WeightCodec C = WeightCodec::Fp8Block;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < WeightChunk<C>::kGranules; ++j) {
    if (j * 64 >= kw) break;
    const uint4 wa = w.a[j], wb = w.b[j];
    const int gi = j * 64 / kA8Group;
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass<C>; ++tile) {
      if (tile >= st.tiles) break;
      const uint4 xb = *reinterpret_cast<const uint4*>(a8_row(x, tile * 8 + g) + j * 64 + t * 16);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      mma_e4m3_16832(d, wa.x, wb.x, wa.y, wb.y, xb.x, xb.y);
      mma_e4m3_16832(d, wa.z, wb.z, wa.w, wb.w, xb.z, xb.w);
      const float x0 = xscale[tile * 8 + 2 * t][gi], x1 = xscale[tile * 8 + 2 * t + 1][gi];
      acc[tile][0] = fmaf(d[0], w.s[j].a * x0, acc[tile][0]);
      acc[tile][1] = fmaf(d[1], w.s[j].a * x1, acc[tile][1]);
      acc[tile][2] = fmaf(d[2], w.s[j].b * x0, acc[tile][2]);
      acc[tile][3] = fmaf(d[3], w.s[j].b * x1, acc[tile][3]);
    }
  }
}

// What decoding a granule needs besides its bytes, formed once before its first sub-step: the
// fp8 block scales of rows g and g + 8; the nvfp4 group scales of inputs 0–15 and 16–31 of each
// row as bf16 pairs; the int8 / int4 group scales and mins (bf16: nothing).
template <WeightCodec C>
struct DecodeScales {
  float a = 0.f, b = 0.f, ma = 0.f, mb = 0.f;
};
template <>
struct DecodeScales<WeightCodec::Nvfp4> {
  __nv_bfloat162 a[2], b[2];
};

template <WeightCodec C>
__device__ __forceinline__ DecodeScales<C> decode_scales(const WeightChunk<C>& w, int j) {
  DecodeScales<C> d;
  if constexpr (C == WeightCodec::Fp8Block) {
    d.a = w.s[j].a;
    d.b = w.s[j].b;
  } else if constexpr (C == WeightCodec::Int8 || C == WeightCodec::Int4) {
    d.a = w.s[j].a;
    d.b = w.s[j].b;
    d.ma = w.s[j].ma;
    d.mb = w.s[j].mb;
  } else if constexpr (C == WeightCodec::Nvfp4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d.a[h] = fp4_group_scale(static_cast<unsigned char>(w.s[j].a >> (8 * h)));
      d.b[h] = fp4_group_scale(static_cast<unsigned char>(w.s[j].b >> (8 * h)));
    }
  }
  return d;
}

// A fragments of sub-step sp of granule j: 8 bf16 of row g (da) and of row g + 8 (db) at the
// lane's inputs 8·sp .. 8·sp + 7 of the granule.
template <WeightCodec C>
__device__ __forceinline__ void decode_step(const WeightChunk<C>& w, int j, int sp, const DecodeScales<C>& sc,
                                            uint4& da, uint4& db) {
  if constexpr (C == WeightCodec::Bf16) {
    da = w.a[j];
    db = w.b[j];
  } else if constexpr (C == WeightCodec::Fp8Block) {
    // bytes 8·sp .. 8·sp + 7: words .x/.y or .z/.w
    da = decode_fp8x8(sp == 0 ? make_uint2(w.a[j].x, w.a[j].y) : make_uint2(w.a[j].z, w.a[j].w), sc.a);
    db = decode_fp8x8(sp == 0 ? make_uint2(w.b[j].x, w.b[j].y) : make_uint2(w.b[j].z, w.b[j].w), sc.b);
  } else if constexpr (C == WeightCodec::Int8) {
    da = decode_i8x8(sp == 0 ? make_uint2(w.a[j].x, w.a[j].y) : make_uint2(w.a[j].z, w.a[j].w), sc.a, sc.ma);
    db = decode_i8x8(sp == 0 ? make_uint2(w.b[j].x, w.b[j].y) : make_uint2(w.b[j].z, w.b[j].w), sc.b, sc.mb);
  } else if constexpr (C == WeightCodec::Int4) {
    // word sp holds inputs 8·sp .. 8·sp + 7 of the granule's one group
    da = decode_u4x8(word_of(w.a[j], sp), sc.a, sc.ma);
    db = decode_u4x8(word_of(w.b[j], sp), sc.b, sc.mb);
  } else {
    // word sp holds inputs 8·sp .. 8·sp + 7 (nibble i = input i); 0–15 scale 0, 16–31 scale 1
    da = decode_fp4x8(word_of(w.a[j], sp), sc.a[sp / 2]);
    db = decode_fp4x8(word_of(w.b[j], sp), sc.b[sp / 2]);
  }
}

// Software pipeline, two stages: while chunk c is multiplied, the weights of chunk c + 1 are in
// flight in registers and its activations are copied into the other shared buffer (cp.async), so
// each block keeps one to two chunks of weight bytes in flight instead of stalling per chunk.
// kA8: W8A8 (Fp8Block only), the activations e4m3 with their scales in xscale.
template <WeightCodec C, bool kA8>
__device__ __forceinline__ void pipeline_step(const MoeGemmParams& p, const PassState& st,
                                              bf16 (*xs)[kPassRows<C>][kChunkPad<C>],
                                              float (*xscale)[kPassRows<C>][kA8Groups], const int* src_row,
                                              float (&acc)[kTilesPerPass<C>][4], const WeightChunk<C>& cur,
                                              WeightChunk<C>& nxt, int c) {
  constexpr int G = kGranuleSteps<C>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (c + 1 < st.nchunks) {
    const int kc = (c + 1) * kChunk<C>, kw = min(kChunk<C>, p.k - kc);
    load_weights<C>(p, st, kc, kw, nxt);
    if constexpr (kA8) copy_activations_a8(p, st, src_row, xs[(c + 1) & 1], xscale[(c + 1) & 1], kc, kw);
    else copy_activations<C>(p, st, src_row, xs[(c + 1) & 1], kc, kw);
  }
  cp_async_commit();  // possibly empty: keeps the group count uniform for wait_group 1
  cp_async_wait<1>();
  __syncthreads();  // chunk c's activations are in shared memory for every warp
  const int kw = min(kChunk<C>, p.k - c * kChunk<C>);
  if constexpr (kA8) {
    multiply_chunk_a8(st, xs[c & 1], xscale[c & 1], acc, cur, kw);
    __syncthreads();  // xs[c & 1] is refilled by the next step's copies
    return;
  }
  const bf16(*x)[kChunkPad<C>] = xs[c & 1];
  DecodeScales<C> sc;
#pragma unroll
  for (int s = 0; s < kSteps<C>; ++s) {
    const int j = s / G, sp = s % G;  // window (= granule) and sub-step
    if (j * 32 * G >= kw) break;      // whole windows: the tail's missing granules are zeros
    if (sp == 0) sc = decode_scales<C>(cur, j);
    uint4 da, db;
    decode_step<C>(cur, j, sp, sc, da, db);
    // the activations of the same k: vector (window j, lane t's granule, sub-step sp)
    const int col = xs_vec<C>(j * 4 * G + t * G + sp) * 8;
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass<C>; ++tile) {
      if (tile >= st.tiles) break;
      const uint4 xb = *reinterpret_cast<const uint4*>(&x[tile * 8 + g][col]);
      mma_bf16_16816(acc[tile], da.x, db.x, da.y, db.y, xb.x, xb.y);
      mma_bf16_16816(acc[tile], da.z, db.z, da.w, db.w, xb.z, xb.w);
    }
  }
  __syncthreads();  // xs[c & 1] is refilled by the next step's copies
}

// Swapped product: C[weight row, token] = W · Xᵀ, so the 8-wide MMA N side carries tokens
// (decode has few per expert) and the 16-wide M side carries weight rows.
// The k order is permuted identically for A and B (a dot product does not care): in a window of
// 32·G k (G granule steps: 1 bf16, 2 fp8, 4 nvfp4) lane (g, t) owns k [t·8G, t·8G + 8G), one
// 16-byte granule per A row, and sub-step sp of the window multiplies its inputs 8·sp .. 8·sp + 7:
// registers .x/.y of the decoded 8 feed the first MMA, .z/.w the second. G = 1 is 8 consecutive
// k at t·8 of each 32-wide step.
// kSilu: A rows g are gate rows and g + 8 the matching up rows, so each lane holds gate and up
// of the same (column, token) in c0/c2 and c1/c3 and applies SiLU·mul before the one rounding.
// Three blocks per SM (≤ 168 registers): enough weight bytes in flight per SM at every batch.
template <WeightCodec C>
constexpr int kBlocksPerSm = 3;

template <bool kSilu, WeightCodec C, bool kA8 = false>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm<C>) moe_gemm_kernel(MoeGemmParams p) {
  pdl_sync();
  constexpr int kColsPerWarp = kSilu ? 8 : 16;
  constexpr int kColsPerBlock = kWarps * kColsPerWarp;
  constexpr int kRows = kPassRows<C>;
  __shared__ alignas(16) bf16 xs[2][kRows][kChunkPad<C>];
  __shared__ float xscale[2][kA8 ? kRows : 1][kA8Groups];  // W8A8: activation scales
  __shared__ int src_row[kRows];
  __shared__ int dst_row[kRows];

  int e = blockIdx.y;
  if (p.active_experts != nullptr) {
    if (e >= p.active_experts[0]) return;
    e = p.active_experts[1 + e];
  }
  const int seg_begin = p.expert_offsets[e], seg_end = p.expert_offsets[e + 1];
  if (seg_begin == seg_end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int col0 = blockIdx.x * kColsPerBlock + warp * kColsPerWarp;
  PassState st;
  st.m0 = st.m1 = nullptr;
  st.warp_active = col0 < p.n;  // n is a multiple of kColsPerWarp: a warp is all in or all out
  st.nchunks = (p.k + kChunk<C> - 1) / kChunk<C>;
  const int col = col0 + g;
  const int rows_per_expert = kSilu ? 2 * p.n : p.n;
  const int row_a = st.warp_active ? col : 0;
  const int row_b = st.warp_active ? (kSilu ? p.n + col : col + 8) : 0;
  // Matrix rows of A rows g and g + 8 (expert e's row r is row e · rows_per_expert + r).
  // size_t: e * rows * k overflows int for real expert stacks.
  const size_t grow_a = static_cast<size_t>(e) * rows_per_expert + row_a;
  const size_t grow_b = static_cast<size_t>(e) * rows_per_expert + row_b;
  const auto* data = static_cast<const unsigned char*>(p.weight.data);
  st.w0 = data + grow_a * codec_row_bytes(C, p.k);
  st.w1 = data + grow_b * codec_row_bytes(C, p.k);
  float row_scale_a = 1.f, row_scale_b = 1.f;  // nvfp4: applied to the fp32 accumulators
  if constexpr (C == WeightCodec::Fp8Block) {
    const size_t scale_cols = (p.k + p.weight.group - 1) / p.weight.group;
    st.s0 = static_cast<const float*>(p.weight.scales) + grow_a * scale_cols;
    st.s1 = static_cast<const float*>(p.weight.scales) + grow_b * scale_cols;
  } else if constexpr (C == WeightCodec::Nvfp4) {
    st.s0 = static_cast<const unsigned char*>(p.weight.scales) + grow_a * (p.k / 16);
    st.s1 = static_cast<const unsigned char*>(p.weight.scales) + grow_b * (p.k / 16);
    row_scale_a = p.weight.row_scales[grow_a];
    row_scale_b = p.weight.row_scales[grow_b];
  } else if constexpr (C == WeightCodec::Int8 || C == WeightCodec::Int4) {
    const size_t groups = (p.k + p.weight.group - 1) / p.weight.group;
    st.s0 = static_cast<const float*>(p.weight.scales) + grow_a * groups;
    st.s1 = static_cast<const float*>(p.weight.scales) + grow_b * groups;
    if (p.weight.mins) {
      st.m0 = p.weight.mins + grow_a * groups;
      st.m1 = p.weight.mins + grow_b * groups;
    }
  } else {
    st.s0 = st.s1 = nullptr;
  }

  for (int pass = seg_begin; pass < seg_end; pass += kRows) {
    const int rows = min(kRows, seg_end - pass);  // multiple of 8 (padded segments)
    st.tiles = rows / kMoeGemmTileM;
    __syncthreads();  // the previous pass is done with src_row/dst_row
    if (threadIdx.x < kRows) {
      const int id = threadIdx.x < rows ? p.sorted_ids[pass + threadIdx.x] : p.num_pairs;
      const bool real = id >= 0 && id < p.num_pairs;
      dst_row[threadIdx.x] = real ? id : -1;
      src_row[threadIdx.x] = real ? id / p.in_row_div : -1;
    }
    __syncthreads();
    float acc[kTilesPerPass<C>][4] = {};
    WeightChunk<C> wa, wb;
    // Prologue: chunk 0 goes into wa / xs[0] through the step for chunk -1's slot.
    {
      const int kw = min(kChunk<C>, p.k);
      load_weights<C>(p, st, 0, kw, wa);
      if constexpr (kA8) copy_activations_a8(p, st, src_row, xs[0], xscale[0], 0, kw);
      else copy_activations<C>(p, st, src_row, xs[0], 0, kw);
      cp_async_commit();
    }
    // Two calls per iteration with the buffers swapped: register arrays keep compile-time indices.
    auto* xsc = reinterpret_cast<float (*)[kRows][kA8Groups]>(&xscale[0][0][0]);  // unused unless kA8
    for (int c = 0; c < st.nchunks; c += 2) {
      pipeline_step<C, kA8>(p, st, xs, xsc, src_row, acc, wa, wb, c);
      if (c + 1 < st.nchunks) pipeline_step<C, kA8>(p, st, xs, xsc, src_row, acc, wb, wa, c + 1);
    }
    if (!st.warp_active) continue;
    // C fragment: c0/c1 = (row g, tokens 2t, 2t+1), c2/c3 = (row g+8, same tokens).
#pragma unroll
    for (int tile = 0; tile < kTilesPerPass<C>; ++tile) {
      if (tile >= st.tiles) break;
      const int d0 = dst_row[tile * 8 + 2 * t], d1 = dst_row[tile * 8 + 2 * t + 1];
      float c4[4] = {acc[tile][0], acc[tile][1], acc[tile][2], acc[tile][3]};
      if constexpr (C == WeightCodec::Nvfp4) {
        c4[0] *= row_scale_a;
        c4[1] *= row_scale_a;
        c4[2] *= row_scale_b;
        c4[3] *= row_scale_b;
      }
      if constexpr (kSilu) {
        if (d0 >= 0) p.out[static_cast<size_t>(d0) * p.n + col] = __float2bfloat16(c4[0] / (1.f + expf(-c4[0])) * c4[2]);
        if (d1 >= 0) p.out[static_cast<size_t>(d1) * p.n + col] = __float2bfloat16(c4[1] / (1.f + expf(-c4[1])) * c4[3]);
      } else {
        if (d0 >= 0) {
          bf16* o = p.out + static_cast<size_t>(d0) * p.n;
          o[col] = __float2bfloat16(c4[0]);
          o[col + 8] = __float2bfloat16(c4[2]);
        }
        if (d1 >= 0) {
          bf16* o = p.out + static_cast<size_t>(d1) * p.n;
          o[col] = __float2bfloat16(c4[1]);
          o[col + 8] = __float2bfloat16(c4[3]);
        }
      }
    }
  }
}

template <WeightCodec C>
void launch(const MoeGemmParams& p, dim3 grid, cudaStream_t stream) {
  if constexpr (C == WeightCodec::Fp8Block) {
    if (p.in_fp8 != nullptr) {
      if (p.silu_gate_up)
        launch_dependent(moe_gemm_kernel<true, C, true>, grid, kWarps * 32, 0, stream, p);
      else
        launch_dependent(moe_gemm_kernel<false, C, true>, grid, kWarps * 32, 0, stream, p);
      return;
    }
  }
  if (p.silu_gate_up) {
    launch_dependent(moe_gemm_kernel<true, C>, grid, kWarps * 32, 0, stream, p);
  } else {
    launch_dependent(moe_gemm_kernel<false, C>, grid, kWarps * 32, 0, stream, p);
  }
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

void check_moe_gemm_params(const MoeGemmParams& p, const char* op) {
  const std::string name(op);
  const int col_multiple = p.silu_gate_up ? 8 : 16;
  const QuantMatrix& w = p.weight;
  MB_CHECK(p.n > 0 && p.n % col_multiple == 0,
           name + ": n must be a positive multiple of 16 (8 with silu_gate_up)");
  MB_CHECK(p.k > 0 && p.k % 32 == 0, name + ": k must be a positive multiple of 32");
  MB_CHECK(p.num_experts > 0 && p.num_experts <= 65535, name + ": bad expert count");
  MB_CHECK(p.in_row_div > 0 && p.num_pairs >= 0, name + ": bad pair mapping");
  MB_CHECK(p.out && p.in && w.data && p.sorted_ids && p.expert_offsets, name + ": null operand");
  MB_CHECK(aligned(w.data, 16), name + ": weight data must be 16-byte aligned");
  MB_CHECK(p.in_fp8 == nullptr ||
               (w.codec == WeightCodec::Fp8Block && w.group % 64 == 0 && p.k % kA8Group == 0 && p.in_scales &&
                aligned(p.in_fp8, 16)),
           name + ": e4m3 activations need FP8-block weights with a group that is a multiple of 64, k % 128 == 0, "
                  "their scales and 16-byte aligned rows");
  check_quant_matrix(w, op);
}

void moe_gemm(const MoeGemmParams& p, cudaStream_t stream) {
  check_moe_gemm_params(p, "moe_gemm");
  MB_CHECK(!p.direct_topk, "moe_gemm: direct_topk is moe_gemv's (one token)");
  const int col_multiple = p.silu_gate_up ? 8 : 16;
  const QuantMatrix& w = p.weight;
  if (p.num_pairs == 0) return;
  const int cols_per_block = kWarps * col_multiple;
  const int expert_blocks = p.active_experts != nullptr ? std::min(p.num_experts, p.num_pairs) : p.num_experts;
  const dim3 grid(CEIL_DIV(p.n, cols_per_block), expert_blocks);
  with_codec(w.codec, [&]<WeightCodec C>() { launch<C>(p, grid, stream); });
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
