#include "tests/gpu/ops/quant_util.h"

#include <cstring>


namespace moebatch::ops {

kernels::WeightCodec codec_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::fp8_block: return kernels::WeightCodec::Fp8Block;
    case WeightFormat::nvfp4: return kernels::WeightCodec::Nvfp4;
    case WeightFormat::int8: return kernels::WeightCodec::Int8;
    case WeightFormat::int4: return kernels::WeightCodec::Int4;
    case WeightFormat::bf16: break;
  }
  return kernels::WeightCodec::Bf16;
}

namespace {

// Random bytes fast enough for the benchmark shapes (hundreds of MB per case): splitmix64 from
// one draw of the case's generator, eight bytes per step.
class ByteStream {
 public:
  explicit ByteStream(std::mt19937& rng) : state_((uint64_t{rng()} << 32) | rng()) {}
  uint8_t next() {
    if (left_ == 0) {
      uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word_ = z ^ (z >> 31);
      left_ = 8;
    }
    --left_;
    const auto b = static_cast<uint8_t>(word_);
    word_ >>= 8;
    return b;
  }

 private:
  uint64_t state_, word_ = 0;
  int left_ = 0;
};

// A random finite E4M3 byte with exponent field in [lo, hi] (0x7f / 0xff are NaN).
uint8_t random_e4m3(ByteStream& bytes, int lo, int hi) {
  const uint8_t r = bytes.next();
  const int e = lo + (r >> 3 & 0xf) % (hi - lo + 1);
  int m = r & 7;
  if (e == 15 && m == 7) m = 6;
  return static_cast<uint8_t>((bytes.next() & 0x80) | e << 3 | m);
}

}  // namespace

RandomQuantMatrix::RandomQuantMatrix(WeightFormat f, int64_t rows, int64_t cols, float scale,
                                     std::mt19937& rng)
    : format_(f), rows_(rows), cols_(cols) {
  MB_CHECK(rows > 0 && cols > 0 && cols % 16 == 0, "RandomQuantMatrix: cols must be a multiple of 16");
  const size_t n = static_cast<size_t>(rows * cols);
  std::uniform_real_distribution<float> uni(-scale, scale);
  switch (f) {
    case WeightFormat::bf16: {
      m_.data.resize(2 * n);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = f2bf(uni(rng));
        std::memcpy(&m_.data[2 * i], &b, 2);
      }
      break;
    }
    case WeightFormat::fp8_block: {
      // Codes spread over 2^-6 .. 2^8 (subnormals included); block scales bring ±448 to ±scale.
      group_ = 128;
      const int64_t scale_cols = (cols + group_ - 1) / group_;
      m_.data.resize(n);
      ByteStream bytes(rng);
      for (auto& b : m_.data) b = random_e4m3(bytes, 0, 15);
      std::vector<float> s(static_cast<size_t>(rows * scale_cols));
      std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
      for (auto& v : s) v = scale / 448.0f * jitter(rng);
      m_.scales.resize(s.size() * 4);
      std::memcpy(m_.scales.data(), s.data(), m_.scales.size());
      break;
    }
    case WeightFormat::nvfp4: {
      MB_CHECK(cols % 32 == 0, "RandomQuantMatrix: nvfp4 needs cols a multiple of 32");
      group_ = 16;
      m_.data.resize(n / 2);
      ByteStream bytes(rng);
      for (auto& b : m_.data) b = bytes.next();
      m_.scales.resize(n / 16);
      for (auto& b : m_.scales) b = random_e4m3(bytes, 5, 8) & 0x7f;  // positive, 2^-2 .. 2^1
      m_.row_scales.resize(static_cast<size_t>(rows));
      std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
      for (auto& v : m_.row_scales) v = scale / 6.0f * jitter(rng);
      break;
    }
    case WeightFormat::int8:
    case WeightFormat::int4: {
      // Random codes; per group a scale (codes' range to about ±scale) and a min (int4: near
      // the centre of its unsigned range, as Q4_K's; int8: a small offset, as Q5_K's).
      const bool i4 = f == WeightFormat::int4;
      MB_CHECK(cols % 32 == 0, "RandomQuantMatrix: integer formats need cols a multiple of 32");
      group_ = i4 ? 32 : 16;
      m_.data.resize(i4 ? n / 2 : n);
      ByteStream bytes(rng);
      for (auto& b : m_.data) b = bytes.next();
      const size_t groups = n / static_cast<size_t>(group_);
      std::vector<float> s(groups);
      m_.mins.resize(groups);
      std::uniform_real_distribution<float> jitter(0.5f, 1.5f), centre(-1.f, 1.f);
      for (size_t g = 0; g < groups; ++g) {
        s[g] = scale / (i4 ? 7.5f : 128.f) * jitter(rng);
        m_.mins[g] = i4 ? s[g] * (7.5f + centre(rng)) : scale * 0.1f * centre(rng);
      }
      m_.scales.resize(groups * 4);
      std::memcpy(m_.scales.data(), s.data(), m_.scales.size());
      break;
    }
  }
  d_data_ = DevBuf<uint8_t>(m_.data);
  if (!m_.scales.empty()) d_scales_ = DevBuf<uint8_t>(m_.scales);
  if (!m_.row_scales.empty()) d_row_scales_ = DevBuf<float>(m_.row_scales);
  if (!m_.mins.empty()) d_mins_ = DevBuf<float>(m_.mins);
}

kernels::QuantMatrix RandomQuantMatrix::view() const {
  kernels::QuantMatrix m;
  m.codec = codec_of(format_);
  m.data = d_data_.get();
  m.scales = m_.scales.empty() ? nullptr : d_scales_.get();
  m.row_scales = m_.row_scales.empty() ? nullptr : d_row_scales_.get();
  m.mins = m_.mins.empty() ? nullptr : d_mins_.get();
  m.group = group_;
  return m;
}

float RandomQuantMatrix::value(int64_t r, int64_t c) const {
  const moebatch::WeightFormat f = format_ == WeightFormat::fp8_block ? moebatch::WeightFormat::Fp8Block
                                    : format_ == WeightFormat::nvfp4  ? moebatch::WeightFormat::Nvfp4
                                    : format_ == WeightFormat::int8   ? moebatch::WeightFormat::Int8
                                    : format_ == WeightFormat::int4   ? moebatch::WeightFormat::Int4
                                                                      : moebatch::WeightFormat::Bf16;
  return packed_value(f, m_, cols_, group_, r, c);
}

double RandomQuantMatrix::bytes() const {
  return static_cast<double>(m_.data.size() + m_.scales.size() +
                             (m_.row_scales.size() + m_.mins.size()) * sizeof(float));
}

}  // namespace moebatch::ops
