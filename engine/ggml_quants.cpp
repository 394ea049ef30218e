#include "engine/ggml_quants.h"

#include <cstring>

#include "common/error.h"

namespace moebatch {
namespace {

constexpr int kQK = 256;  // elements of a k-quant super-block

float half(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

const uint8_t* bytes(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4).
void scale_min(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One sub-block of a ggml integer format: its codes, scale and min.
struct SubBlock {
  int8_t q[32];
  float scale, min;
};

// The sub-blocks of one ggml block, in element order, with ggml's fp32 scale and min products:
//   Q8_0  f16 d, 32 × int8: one sub-block, y = d · q
//   Q4_K  f16 d, f16 dmin, 12 bytes of packed 6-bit scales / mins, 128 bytes of 4-bit codes
//         (low nibbles of 32 bytes for sub-block 2i, high for 2i + 1): y = d·sc · q − dmin·m
//   Q5_K  as Q4_K with a fifth bit per element from qh[32] (bit j for sub-block j)
//   Q6_K  128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales, f16 d: sixteen
//         sub-blocks of 16, y = d·scale · (q − 32)
int unpack_block(DType t, const std::byte* b, SubBlock* out) {
  switch (t) {
    case DType::Q8_0: {
      const auto* q = reinterpret_cast<const int8_t*>(b + 2);
      std::memcpy(out[0].q, q, 32);
      out[0].scale = half(b);
      out[0].min = 0.f;
      return 1;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const float d = half(b), dmin = half(b + 2);
      const uint8_t* scales = bytes(b + 4);
      const bool five = t == DType::Q5_K;
      const uint8_t* qh = bytes(b + 16);
      const uint8_t* q = bytes(b + (five ? 48 : 16));
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min(j, scales, sc, m);
        out[j].scale = d * sc;
        out[j].min = dmin * m;
        const uint8_t* ql = q + 32 * (j / 2);
        const uint8_t bit = static_cast<uint8_t>(1u << j);  // Q5_K: sub-block j's fifth bit
        for (int l = 0; l < 32; ++l) {
          int v = (j & 1) ? ql[l] >> 4 : ql[l] & 0xF;
          if (five && (qh[l] & bit)) v += 16;
          out[j].q[l] = static_cast<int8_t>(v);
        }
      }
      return 8;
    }
    case DType::Q6_K: {
      const uint8_t* ql = bytes(b);
      const uint8_t* qh = bytes(b + 128);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half(b + 208);
      // element n + l + 32·s of each 128-half (s = 0..3), sub-block of 16: (n + 32 s + l) / 16
      for (int n = 0; n < kQK; n += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; ++l) {
          const int v[4] = {(ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4),
                            (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)};
          for (int s = 0; s < 4; ++s) {
            const int e = n + 32 * s + l;  // element within the super-block
            out[e / 16].q[e % 16] = static_cast<int8_t>(v[s] - 32);
          }
        }
        for (int s = 0; s < 8; ++s) {
          out[n / 16 + s].scale = d * sc[s];
          out[n / 16 + s].min = 0.f;
        }
      }
      return 16;
    }
    default:
      throw InputError(std::string("dtype ") + dtype_name(t) + " is not a ggml integer format");
  }
}

}  // namespace

int ggml_subblock(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
      return 32;
    case DType::Q6_K:
      return 16;
    default:
      return 0;
  }
}

void unpack_row(DType t, const std::byte* src, int64_t n, int group, int8_t* codes,
                float* scales, float* mins) {
  const int sub = ggml_subblock(t);
  MB_CHECK(sub > 0 && group > 0 && sub % group == 0, "unpack_row: group must divide the sub-block");
  const DTypeBlock blk = dtype_block(t);
  MB_CHECK(n % blk.elems == 0, "unpack_row: n must be a whole number of blocks");
  SubBlock sb[16];
  int64_t e = 0;
  for (int64_t i = 0; i < n / blk.elems; ++i) {
    const int count = unpack_block(t, src + i * blk.bytes, sb);
    for (int s = 0; s < count; ++s, e += sub) {
      std::memcpy(codes + e, sb[s].q, static_cast<size_t>(sub));
      for (int g = 0; g < sub / group; ++g) {
        scales[(e + g * group) / group] = sb[s].scale;
        mins[(e + g * group) / group] = sb[s].min;
      }
    }
  }
}

void dequantize_row(DType t, const std::byte* src, float* dst, int64_t n) {
  const DTypeBlock blk = dtype_block(t);
  MB_CHECK(n % blk.elems == 0, "dequantize_row: n must be a whole number of blocks");
  const int64_t blocks = n / blk.elems;
  for (int64_t i = 0; i < blocks; ++i) {
    const std::byte* b = src + i * blk.bytes;
    float* y = dst + i * blk.elems;
    switch (t) {
      case DType::Q8_0:
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K: {
        SubBlock sb[16];
        const int count = unpack_block(t, b, sb), sub = static_cast<int>(blk.elems) / count;
        for (int s = 0; s < count; ++s)
          for (int i = 0; i < sub; ++i)
            y[s * sub + i] = static_cast<float>(sb[s].q[i]) * sb[s].scale - sb[s].min;
        break;
      }
      case DType::F32:
        std::memcpy(y, b, 4);
        break;
      case DType::F16:
        *y = half(b);
        break;
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, b, 2);
        *y = bf16_to_f32(h);
        break;
      }
      default:
        throw InputError(std::string("dtype ") + dtype_name(t) + " is not a weight format");
    }
  }
}

}  // namespace moebatch
