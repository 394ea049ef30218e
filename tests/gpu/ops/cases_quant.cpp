// Cases of the compressed-weight dense kernels (kernels/quant.cuh): quant_linear on each of its
// paths (and the persistent bf16 GEMV, kernels/gemv_stream.cuh) against an fp64 reference on the
// exactly decoded weights, dequantize bit-exact, and the FP8 / NVFP4 quantizers against a host
// reference quantizer written here.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "engine/hub_tensor.h"
#include "engine/safetensors.h"
#include "kernels/gemv_stream.cuh"
#include "kernels/quant.cuh"
#include "tests/gpu/ops/op_shapes.h"
#include "tests/gpu/ops/quant_util.h"

namespace moebatch::ops {
namespace {

using kernels::QuantLinearPath;
using std::to_string;

kernels::QuantLinearPath path_of(const QuantLinearShape& s) {
  return kernels::quant_linear_path(codec_of(s.format), s.m);
}

// {{"m", 1}, {"n", 512}} -> "m1 n512"; appends (no literal + string temporaries: GCC 12's
// -Wrestrict misfires on those at -O3).
std::string shape_str(std::initializer_list<std::pair<const char*, int>> parts) {
  std::string s;
  for (const auto& [key, v] : parts) {
    if (!s.empty()) s += ' ';
    s += key;
    s += to_string(v);
  }
  return s;
}

std::string label(const char* op, WeightFormat f, const char* suffix = "") {
  std::string s = op;
  s += ' ';
  s += weight_format_name(f);
  s += suffix;
  return s;
}

class QuantLinearCase final : public OpCase {
 public:
  explicit QuantLinearCase(const QuantLinearShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    x_ = RandomBf16(static_cast<size_t>(s_.m) * s_.k, 1.f, rng, env.stream);
    w_ = RandomQuantMatrix(s_.format, s_.n, s_.k, s_.w_scale, rng);
    views_.assign(1, w_.view());
    copies_.clear();
    const int64_t copies =
        s_.rotate_bytes > 0
            ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(s_.rotate_bytes / w_.bytes())))
            : 1;
    for (int64_t j = 1; j < copies; ++j) views_.push_back(copy_weights(views_[0]));
    if (s_.stream)
      kernels::gemv_stream_prepare();
    else if (path_of(s_) == QuantLinearPath::DequantCublas)
      scratch_ = DevBuf<bf16>(static_cast<size_t>(s_.n) * s_.k);
    const size_t n_out = static_cast<size_t>(s_.m) * s_.n;
    if (s_.fp32_out) {
      out_f_ = DevBuf<float>(n_out);
      out_f_.poison();
    } else {
      out_b_ = DevBuf<bf16>(n_out);
      out_b_.poison();
    }
  }
  void run(const OpEnv& env, int iter) override {
    const kernels::QuantMatrix& w = views_[static_cast<size_t>(iter) % views_.size()];
    if (s_.stream) {
      const auto* wb = static_cast<const bf16*>(w.data);
      if (s_.fp32_out)
        kernels::gemv_stream(out_f_.get(), x_.get(), wb, s_.m, s_.n, s_.k, env.stream);
      else
        kernels::gemv_stream(out_b_.get(), x_.get(), wb, s_.m, s_.n, s_.k, env.stream);
      return;
    }
    MB_CHECK(env.cublas != nullptr, "quant_linear case: needs a cuBLAS handle in OpEnv");
    if (s_.fp32_out)
      kernels::quant_linear(env.cublas, env.stream, out_f_.get(), x_.get(), w, s_.m, s_.n, s_.k,
                            scratch_.get(), scratch_.size());
    else
      kernels::quant_linear(env.cublas, env.stream, out_b_.get(), x_.get(), w, s_.m, s_.n, s_.k,
                            scratch_.get(), scratch_.size());
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const int m = s_.m, n = s_.n, k = s_.k;
    const auto x = x_.original_f(env.stream);
    std::vector<double> ref(static_cast<size_t>(m) * n);
    parallel_for(n, [&](size_t j) {
      std::vector<double> w(k);
      for (int c = 0; c < k; ++c) w[c] = w_.value(static_cast<int64_t>(j), c);
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int c = 0; c < k; ++c) s += x[static_cast<size_t>(i) * k + c] * w[c];
        ref[static_cast<size_t>(i) * n + j] = s;
      }
    });
    OpCheck c;
    c.rel_l2("out", s_.fp32_out ? out_f_.download<float>() : to_float(out_b_.download<uint16_t>()),
             ref, tol);
    return c;
  }
  // The least one call must move: the weights once, activations and outputs (the dequantize
  // path's scratch traffic is its overhead, not counted).
  double bytes() const override {
    return w_.bytes() + 2.0 * s_.m * s_.k + (s_.fp32_out ? 4.0 : 2.0) * s_.m * s_.n;
  }
  double flops() const override { return 2.0 * s_.m * s_.n * s_.k; }
  std::string note() const override {
    std::string s = quant_linear_path_name(s_);
    if (views_.size() > 1) {
      s += ", ";
      s += to_string(views_.size());
      s += " weight copies";
    }
    return s;
  }

 private:
  // A device copy of W's data and scales (the row scales are shared: a few KB).
  kernels::QuantMatrix copy_weights(const kernels::QuantMatrix& v) {
    const size_t n = static_cast<size_t>(s_.n);
    const size_t data_bytes = n * kernels::codec_row_bytes(v.codec, s_.k);
    size_t scale_bytes = 0;
    if (v.codec == kernels::WeightCodec::Fp8Block)
      scale_bytes = n * ((s_.k + v.group - 1) / v.group) * sizeof(float);
    if (v.codec == kernels::WeightCodec::Nvfp4) scale_bytes = n * (s_.k / 16);
    kernels::QuantMatrix c = v;
    c.data = clone(v.data, data_bytes);
    if (scale_bytes) c.scales = clone(v.scales, scale_bytes);
    return c;
  }
  const void* clone(const void* src, size_t bytes) {
    copies_.emplace_back(bytes);
    CUDA_CHECK(cudaMemcpy(copies_.back().get(), src, bytes, cudaMemcpyDeviceToDevice));
    return copies_.back().get();
  }

  QuantLinearShape s_;
  RandomBf16 x_;
  RandomQuantMatrix w_;
  std::vector<kernels::QuantMatrix> views_;  // [0]: w_ itself, then the copies
  std::vector<DevBuf<uint8_t>> copies_;
  DevBuf<bf16> scratch_;
  DevBuf<float> out_f_;
  DevBuf<bf16> out_b_;
};

class DequantizeCase final : public OpCase {
 public:
  explicit DequantizeCase(const DequantizeShape& s) : s_(s) {}
  void setup(const OpEnv&, uint32_t seed) override {
    std::mt19937 rng(seed);
    w_ = RandomQuantMatrix(s_.format, s_.rows, s_.cols, 1.f, rng);
    out_ = DevBuf<bf16>(static_cast<size_t>(s_.rows) * s_.cols);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::dequantize(w_.view(), s_.rows, s_.cols, out_.get(), env.stream);
  }
  // value() is the decoded value in fp32, row scale included (an Nvfp4 code times its group
  // scale is exact, times the row scale rounds once in fp32, as in the kernel), so the bf16
  // output must equal its one rounding bit for bit.
  OpCheck check(const OpEnv&, double) override {
    std::vector<uint16_t> want(static_cast<size_t>(s_.rows) * s_.cols);
    for (int r = 0; r < s_.rows; ++r)
      for (int c = 0; c < s_.cols; ++c)
        want[static_cast<size_t>(r) * s_.cols + c] = f2bf(w_.value(r, c));
    OpCheck c;
    c.equal("out", out_.download<uint16_t>(), want);
    return c;
  }
  double bytes() const override { return w_.bytes() + 2.0 * s_.rows * s_.cols; }

 private:
  DequantizeShape s_;
  RandomQuantMatrix w_;
  DevBuf<bf16> out_;
};

// --- host reference quantizers --------------------------------------------------------------

// The E4M3 byte nearest to f, ties to even, saturating to ±448: __nv_cvt_float_to_fp8(f,
// __NV_SATFINITE, __NV_E4M3). In binade E (2^E ≤ |f| < 2^(E+1), E ≥ -6; below 2^-6 the
// subnormal quantum 2^-9) |f| = q · 2^(E-3) with q in [8, 16] (q < 8 only for subnormals), and
// the code is (E + 6) · 8 + q: q = 16 carries into the next binade's code.
uint8_t e4m3_rne(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (std::isnan(a)) return 0x7f;
  if (a >= 448.f) return sign | 0x7e;
  if (a == 0.f) return sign;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int E = std::max(e - 1, -6);
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - E)));
  return static_cast<uint8_t>(sign | ((E + 6) * 8 + q));
}

// Nearest E2M1 code, ties to the even code, sign only on a nonzero magnitude (as the kernel).
uint8_t e2m1_rne(float q) {
  const float a = std::fabs(q);
  const uint8_t m = a <= 0.25f   ? 0
                    : a < 0.75f  ? 1
                    : a <= 1.25f ? 2
                    : a < 1.75f  ? 3
                    : a <= 2.5f  ? 4
                    : a < 3.5f   ? 5
                    : a <= 5.f   ? 6
                                 : 7;
  return q < 0.f && m != 0 ? static_cast<uint8_t>(m | 8) : m;
}

struct Quantized {
  std::vector<uint8_t> data;
  std::vector<float> scales;        // fp8, int4
  std::vector<uint8_t> scale_e4m3;  // nvfp4
  std::vector<float> row_scales;    // nvfp4
  std::vector<float> mins;          // int4
};

// kernels::quantize_int4_rows's arithmetic: per 32 inputs lo / hi, scale (hi − lo) / 15 (1 when
// equal), min −lo, code rint((v − lo) / scale) clamped to 0..15.
Quantized quantize_int4_ref(const std::vector<float>& in) {
  Quantized q;
  const size_t groups = in.size() / 32;
  q.data.assign(in.size() / 2, 0);
  q.scales.resize(groups);
  q.mins.resize(groups);
  for (size_t g = 0; g < groups; ++g) {
    const float* v = &in[32 * g];
    const float lo = *std::min_element(v, v + 32), hi = *std::max_element(v, v + 32);
    const float scale = hi > lo ? (hi - lo) / 15.f : 1.f;
    q.scales[g] = scale;
    q.mins[g] = -lo;
    for (int j = 0; j < 32; ++j) {
      const float code = std::clamp(std::nearbyint((v[j] - lo) / scale), 0.f, 15.f);
      q.data[16 * g + j / 2] |= static_cast<uint8_t>(static_cast<unsigned>(code) << (4 * (j & 1)));
    }
  }
  return q;
}

Quantized quantize_fp8_ref(const std::vector<float>& in, int rows, int cols, int group) {
  const int groups = (cols + group - 1) / group;
  Quantized q;
  q.data.resize(in.size());
  q.scales.resize(static_cast<size_t>(rows) * groups);
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < groups; ++g) {
      const size_t c0 = static_cast<size_t>(r) * cols + static_cast<size_t>(g) * group;
      const int len = std::min(group, cols - g * group);
      float amax = 0.f;
      for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(in[c0 + j]));
      const float scale = amax > 0.f ? amax / 448.f : 1.f;
      q.scales[static_cast<size_t>(r) * groups + g] = scale;
      for (int j = 0; j < len; ++j) q.data[c0 + j] = e4m3_rne(in[c0 + j] / scale);
    }
  return q;
}

Quantized quantize_nvfp4_ref(const std::vector<float>& in, int rows, int cols) {
  Quantized q;
  q.data.assign(in.size() / 2, 0);
  q.scale_e4m3.resize(in.size() / 16);
  q.row_scales.resize(rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = &in[static_cast<size_t>(r) * cols];
    float amax = 0.f;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float rs = amax > 0.f ? amax / (448.f * 6.f) : 1.f;
    q.row_scales[r] = rs;
    for (int g = 0; g < cols / 16; ++g) {
      float gmax = 0.f;
      for (int j = 0; j < 16; ++j) gmax = std::max(gmax, std::fabs(row[16 * g + j]));
      const uint8_t sb = e4m3_rne(gmax / (6.f * rs));
      const size_t gi = static_cast<size_t>(r) * (cols / 16) + g;
      q.scale_e4m3[gi] = sb;
      const float denom = fp8_e4m3_to_f32(sb) * rs;
      for (int j = 0; j < 16; ++j) {
        const uint8_t code = denom > 0.f ? e2m1_rne(row[16 * g + j] / denom) : 0;
        q.data[gi * 8 + j / 2] |= static_cast<uint8_t>(code << (4 * (j & 1)));
      }
    }
  }
  return q;
}

std::vector<int32_t> widen(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

class QuantizeCase final : public OpCase {
 public:
  explicit QuantizeCase(const QuantizeShape& s)
      : s_(s), fp8_(s.format == WeightFormat::fp8_block), int4_(s.format == WeightFormat::int4) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const size_t n = static_cast<size_t>(s_.rows) * s_.cols;
    x_ = RandomBf16(n, 1.f, rng, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    // Row 1 all zero (scale 1 / row scale 1), the first group of row 2 at 2^-30 (nvfp4: its
    // e4m3 scale rounds to 0, zero codes) and of row 3 at 2^-17 (nvfp4: a subnormal scale).
    in_ = x_.current();
    const int span = std::min(s_.cols, fp8_ ? s_.group : 16);
    std::fill_n(&in_[static_cast<size_t>(s_.cols)], s_.cols, uint16_t{0});
    for (int c = 0; c < span; ++c) {
      uint16_t& a = in_[2 * static_cast<size_t>(s_.cols) + c];
      uint16_t& b = in_[3 * static_cast<size_t>(s_.cols) + c];
      a = f2bf(std::ldexp(bf2f(a), -30));
      b = f2bf(std::ldexp(bf2f(b), -17));
    }
    CUDA_CHECK(cudaMemcpy(x_.get(), in_.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    data_ = DevBuf<uint8_t>(fp8_ ? n : n / 2);
    data_.poison();
    if (fp8_) {
      scales_f_ =
          DevBuf<float>(static_cast<size_t>(scales_ld()) * ((s_.cols + s_.group - 1) / s_.group));
      scales_f_.poison();
    } else if (int4_) {
      scales_f_ = DevBuf<float>(n / 32);
      scales_f_.poison();
      mins_ = DevBuf<float>(n / 32);
      mins_.poison();
    } else {
      scales_b_ = DevBuf<uint8_t>(n / 16);
      scales_b_.poison();
      row_scales_ = DevBuf<float>(s_.rows);
      row_scales_.poison();
    }
  }
  void run(const OpEnv& env, int) override {
    if (fp8_)
      kernels::quantize_fp8_rows(x_.get(), s_.rows, s_.cols, s_.group, data_.get(), scales_f_.get(),
                                 env.stream, 1, s_.group_major ? scales_ld() : 0);
    else if (int4_)
      kernels::quantize_int4_rows(x_.get(), s_.rows, s_.cols, data_.get(), scales_f_.get(),
                                  mins_.get(), env.stream);
    else
      kernels::quantize_nvfp4_rows(x_.get(), s_.rows, s_.cols, data_.get(), scales_b_.get(),
                                   row_scales_.get(), env.stream);
  }
  // Scales bit-exact against the reference quantizer; codes compared decoded (so a -0 / +0 code
  // choice cannot fail); the decoded matrix within the format's error of the input (tol).
  OpCheck check(const OpEnv&, double tol) override {
    const std::vector<float> in = to_float(in_);
    const auto data = data_.download<uint8_t>();
    std::vector<float> codes(in.size()), want_codes(in.size()), decoded(in.size());
    OpCheck c;
    if (fp8_) {
      const Quantized ref = quantize_fp8_ref(in, s_.rows, s_.cols, s_.group);
      const int groups = (s_.cols + s_.group - 1) / s_.group;
      auto scales = scales_f_.download<float>();
      if (s_.group_major) {  // back to [rows, groups]; the pitch's padding stays unwritten
        std::vector<float> by_row(static_cast<size_t>(s_.rows) * groups);
        for (int r = 0; r < s_.rows; ++r)
          for (int g = 0; g < groups; ++g)
            by_row[static_cast<size_t>(r) * groups + g] = scales[static_cast<size_t>(g) * scales_ld() + r];
        c.expect(std::isnan(scales[s_.rows]), "group-major pitch padding untouched");
        scales = std::move(by_row);
      }
      c.equal("scales", scales, ref.scales);
      for (size_t i = 0; i < in.size(); ++i) {
        codes[i] = fp8_e4m3_to_f32(data[i]);
        want_codes[i] = fp8_e4m3_to_f32(ref.data[i]);
        const size_t r = i / s_.cols, col = i % s_.cols;
        decoded[i] = codes[i] * scales[r * groups + col / s_.group];
      }
    } else if (int4_) {
      const Quantized ref = quantize_int4_ref(in);
      const auto scales = scales_f_.download<float>();
      const auto mins = mins_.download<float>();
      c.equal("scales", scales, ref.scales);
      c.equal("mins", mins, ref.mins);
      for (size_t i = 0; i < in.size(); ++i) {
        const int shift = 4 * static_cast<int>(i & 1);
        codes[i] = static_cast<float>((data[i / 2] >> shift) & 0xf);
        want_codes[i] = static_cast<float>((ref.data[i / 2] >> shift) & 0xf);
        decoded[i] = codes[i] * scales[i / 32] - mins[i / 32];
      }
    } else {
      const Quantized ref = quantize_nvfp4_ref(in, s_.rows, s_.cols);
      const auto scales = scales_b_.download<uint8_t>();
      const auto row_scales = row_scales_.download<float>();
      c.equal("row scales", row_scales, ref.row_scales);
      c.equal("group scales", widen(scales), widen(ref.scale_e4m3));
      for (size_t i = 0; i < in.size(); ++i) {
        const int shift = 4 * static_cast<int>(i & 1);
        codes[i] = e2m1_to_f32(static_cast<uint8_t>((data[i / 2] >> shift) & 0xf));
        want_codes[i] = e2m1_to_f32(static_cast<uint8_t>((ref.data[i / 2] >> shift) & 0xf));
        decoded[i] = codes[i] * fp8_e4m3_to_f32(scales[i / 16]) * row_scales[i / s_.cols];
      }
    }
    c.equal("codes (decoded)", codes, want_codes);
    c.rel_l2("decoded vs input", decoded, std::vector<double>(in.begin(), in.end()), tol);
    return c;
  }
  double bytes() const override {
    const double n = static_cast<double>(s_.rows) * s_.cols;
    return 2 * n + (fp8_    ? n + 4.0 * s_.rows * std::ceil(static_cast<double>(s_.cols) / s_.group)
                    : int4_ ? n / 2 + n / 4
                            : n / 2 + n / 16 + 4.0 * s_.rows);
  }

 private:
  int scales_ld() const { return s_.group_major ? s_.rows + 3 : s_.rows; }

  QuantizeShape s_;
  bool fp8_, int4_;
  RandomBf16 x_;
  std::vector<uint16_t> in_;  // the input as quantized (planted rows included)
  DevBuf<uint8_t> data_, scales_b_;
  DevBuf<float> scales_f_, row_scales_, mins_;
};

}  // namespace

// Tolerances: the GEMV decodes exactly and rounds once (bf16 out: ~2^-9 relative; fp32 out:
// fp32 summation only: 1e-5, integer formats 1e-4, whose min · Σx term cancels most of
// scale · Σ code·x); the dequantize path also rounds every weight to bf16 once (~1e-3 relative
// on a dot product); cuBLAS on bf16 weights as linear_case. gemv_stream as the GEMV: fp32 sums
// of exact bf16 products, one rounding.
// The pending combine + add + norm formed inside gemv_stream (kernels::gemv_stream_combine_norm)
// against the launches it replaces: the residual bit for bit as moe_combine_add_rmsnorm leaves
// it, out within tol of the fp64 chain (the combine, bf16 roundings of it and of the residual
// sum as the kernels make them, the norm rounded to bf16 as x, the GEMV), and the ticket counter
// back at zero.
class GemvCombineNormCase final : public OpCase {
 public:
  explicit GemvCombineNormCase(const GemvCombineNormShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    y_ = RandomBf16(static_cast<size_t>(s_.top_k) * s_.hidden, 2.f, rng, env.stream);
    res_ = RandomBf16(s_.hidden, 2.f, rng, env.stream);
    nw_ = RandomBf16(s_.hidden, 1.5f, rng, env.stream);
    w_ = RandomBf16(static_cast<size_t>(s_.n) * s_.hidden, 0.05f, rng, env.stream);
    cw_.resize(s_.top_k);
    for (auto& v : cw_) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
    d_cw_ = DevBuf<float>(cw_);
    counter_ = DevBuf<uint32_t>(std::vector<uint32_t>{0});
    res_init_ = DevBuf<bf16>(s_.hidden);
    CUDA_CHECK(cudaMemcpyAsync(res_init_.get(), res_.get(), s_.hidden * sizeof(bf16), cudaMemcpyDeviceToDevice, env.stream));
    out_ = DevBuf<bf16>(s_.n);
    out_.poison();
    kernels::gemv_stream_prepare();
  }
  void run(const OpEnv& env, int) override {
    // the residual as set up: each launch adds the combine into it once
    CUDA_CHECK(cudaMemcpyAsync(res_.get(), res_init_.get(), s_.hidden * sizeof(bf16), cudaMemcpyDeviceToDevice,
                               env.stream));
    kernels::gemv_stream_combine_norm(out_.get(), combine(), norm(res_.get()), counter_.get(), w_.get(), s_.n,
                                      s_.hidden, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const int H = s_.hidden, K = s_.top_k;
    OpCheck c;
    // the residual: bit for bit as moe_combine_add_rmsnorm leaves it
    const std::vector<uint16_t> res0 = res_.original(env.stream);
    DevBuf<bf16> res(res0.size()), h(static_cast<size_t>(H));
    CUDA_CHECK(cudaMemcpy(res.get(), res0.data(), res0.size() * 2, cudaMemcpyHostToDevice));
    kernels::RmsNormParams n = norm(res.get());
    n.out = h.get();
    kernels::moe_combine_add_rmsnorm(combine(), n, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    c.equal("residual vs moe_combine_add_rmsnorm", res_.current(), res.download<uint16_t>());
    c.expect(counter_.download<uint32_t>()[0] == 0, "ticket counter back at zero");
    // out vs the fp64 chain
    const auto y = y_.original(env.stream), nw = nw_.original(env.stream);
    const auto w = w_.original_f(env.stream);
    std::vector<double> x(H);
    double ss = 0;
    for (int i = 0; i < H; ++i) {
      double o = 0;
      for (int j = 0; j < K; ++j) o += cw_[j] * bf2f(y[static_cast<size_t>(j) * H + i]);
      x[i] = round_bf(bf2f(res0[i]) + round_bf(static_cast<float>(o)));
      ss += x[i] * x[i];
    }
    const double rstd = 1.0 / std::sqrt(ss / H + kEps);
    for (int i = 0; i < H; ++i) x[i] = round_bf(static_cast<float>(x[i] * rstd * (s_.weight_offset + bf2f(nw[i]))));
    std::vector<double> ref(s_.n);
    parallel_for(s_.n, [&](size_t r) {
      double acc = 0;
      for (int i = 0; i < H; ++i) acc += w[r * H + i] * x[i];
      ref[r] = acc;
    });
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);
    return c;
  }
  double bytes() const override { return 2.0 * s_.n * s_.hidden + 2.0 * (s_.top_k + 3) * s_.hidden; }
  double flops() const override { return 2.0 * s_.n * s_.hidden; }

 private:
  static constexpr float kEps = 1e-6f;
  kernels::MoeCombineParams combine() const {
    kernels::MoeCombineParams p;
    p.expert_out = y_.get();
    p.weights = d_cw_.get();
    p.tokens = 1;
    p.top_k = s_.top_k;
    p.hidden = s_.hidden;
    return p;
  }
  kernels::RmsNormParams norm(bf16* residual) const {
    kernels::RmsNormParams n;
    n.residual = residual;
    n.weight = nw_.get();
    n.rows = 1;
    n.cols = s_.hidden;
    n.eps = kEps;
    n.weight_offset = s_.weight_offset;
    return n;
  }
  GemvCombineNormShape s_;
  RandomBf16 y_, res_, nw_, w_;
  std::vector<float> cw_;
  DevBuf<float> d_cw_;
  DevBuf<uint32_t> counter_;
  DevBuf<bf16> out_, res_init_;
};

OpCaseDef gemv_combine_norm_case(const GemvCombineNormShape& s) {
  MB_CHECK(s.top_k > 0 && s.hidden > 0 && s.hidden % 8 == 0 && s.hidden <= kernels::kGemvCombineNormMaxK && s.n > 0,
           "gemv_combine_norm case: hidden a multiple of 8 up to kGemvCombineNormMaxK");
  OpCaseDef d = op_case_def<GemvCombineNormCase>(
      s.weight_offset != 0.f ? "gemv_stream_combine_norm 1+w" : "gemv_stream_combine_norm",
      "k" + to_string(s.top_k) + " H" + to_string(s.hidden) + " n" + to_string(s.n), OpFamily::quant, 5e-3, s);
  d.available = &kernels::gemv_stream_available;
  return d;
}

OpCaseDef quant_linear_case(const QuantLinearShape& s) {
  MB_CHECK(!s.stream || (s.format == WeightFormat::bf16 && s.m <= kernels::kGemvMaxRows),
           "quant_linear case: gemv_stream takes bf16 weights and m <= kGemvMaxRows");
  const bool rounded_weights = !s.stream && path_of(s) == QuantLinearPath::DequantCublas;
  const bool integer = s.format == WeightFormat::int8 || s.format == WeightFormat::int4;
  const double tol = !s.fp32_out ? 1e-2 : rounded_weights ? 5e-3 : integer ? 1e-4 : 1e-5;
  OpCaseDef d = op_case_def<QuantLinearCase>(
      label(s.stream ? "gemv_stream" : "quant_linear", s.format,
            s.fp32_out ? " fp32-out" : " bf16-out"),
      shape_str({{"m", s.m}, {"n", s.n}, {"k", s.k}}), OpFamily::quant, tol, s);
  d.format = s.format;
  if (s.stream) d.available = &kernels::gemv_stream_available;
  return d;
}

const char* quant_linear_path_name(const QuantLinearShape& s) {
  return s.stream ? "gemv_stream" : kernels::quant_linear_path_name(path_of(s));
}

OpCaseDef dequantize_case(const DequantizeShape& s) {
  OpCaseDef d =
      op_case_def<DequantizeCase>(label("dequantize", s.format),
                                  shape_str({{"r", s.rows}, {"c", s.cols}}), OpFamily::quant, 0, s);
  d.format = s.format;
  return d;
}

// tol: relative L2 of the decoded matrix against the input. E4M3 keeps 3 mantissa bits (~2.5%
// rms on uniform inputs); E2M1 with 16-input scales ~11%; 16 levels over a 32-input range ~6.5%.
OpCaseDef quantize_case(const QuantizeShape& s) {
  MB_CHECK(s.format == WeightFormat::fp8_block || s.format == WeightFormat::nvfp4 ||
               s.format == WeightFormat::int4,
           "quantize case: fp8_block, nvfp4 or int4");
  MB_CHECK(s.rows >= 4, "quantize case: rows 1-3 are planted");
  const bool fp8 = s.format == WeightFormat::fp8_block;
  const std::string shape = fp8 ? shape_str({{"r", s.rows}, {"c", s.cols}, {"g", s.group}})
                                : shape_str({{"r", s.rows}, {"c", s.cols}});
  const double tol = fp8 ? 0.04 : s.format == WeightFormat::int4 ? 0.1 : 0.15;
  OpCaseDef d = op_case_def<QuantizeCase>(label("quantize", s.format, s.group_major ? " group-major" : ""), shape,
                                          OpFamily::quant, tol, s);
  d.format = s.format;
  return d;
}

}  // namespace moebatch::ops
