// Cases of the block-scaled FP8 dense GEMM (kernels/gemm_fp8.cuh): bf16 activations quantized
// per 1 × 128 into group-major scales, then cuBLASLt on FP8 tensor cores against bf16 weights
// quantized in 128 × 128 blocks (as FP8 checkpoints hold them) and compacted to the block grid.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "kernels/gemm_fp8.cuh"
#include "kernels/quant.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

constexpr int kGroup = kernels::kFp8BlockGemmGroup;

// The reference multiplies the decoded operands (e4m3 codes times their scales, as the kernels
// wrote them) in fp64, so it tests the GEMM and both scale layouts; the activations' own
// quantization error is the quantizer case's (quantize_fp8_rows). Every weight block and every
// activation group is scaled by its own power of two (exact in bf16), so each scale differs from
// its neighbours' and a scale read from the wrong block or group cannot pass. run() times what
// the engine runs per projection: the activation quantization and the GEMM.
class Fp8BlockGemmCase final : public OpCase {
 public:
  explicit Fp8BlockGemmCase(const Fp8BlockGemmShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int m = s_.m, n = s_.n, k = s_.k, groups = k / kGroup;
    x_ = RandomBf16(static_cast<size_t>(m) * k, 1.f, rng, env.stream);
    w_ = RandomBf16(static_cast<size_t>(n) * k, 0.05f, rng, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));  // the fills ran there
    spread(x_, m, k, [](int r, int g) { return (r * 5 + g * 3) % 7 - 3; });
    spread(w_, n, k, [](int r, int g) { return (r / kGroup * 7 + g * 3) % 9 - 4; });
    w_q_ = DevBuf<uint8_t>(static_cast<size_t>(n) * k);
    w_rs_ = DevBuf<float>(static_cast<size_t>(n) * groups);
    const int ld = kernels::fp8_block_scale_ld(k);
    w_bs_ = DevBuf<float>(static_cast<size_t>(n / kGroup) * ld);
    w_bs_.poison();  // the padding of each row is never read
    kernels::quantize_fp8_rows(w_.get(), n, k, kGroup, w_q_.get(), w_rs_.get(), env.stream, kGroup);
    kernels::compact_block_scales(w_rs_.get(), n, groups, w_bs_.get(), ld, env.stream);
    x_q_ = DevBuf<uint8_t>(static_cast<size_t>(m) * k);
    x_s_ = DevBuf<float>(static_cast<size_t>(groups) * m);
    x_q_.poison();
    x_s_.poison();
    out_ = DevBuf<bf16>(static_cast<size_t>(m) * n);
    out_.poison();
    workspace_ = DevBuf<uint8_t>(size_t{32} << 20);
    gemm_ = std::make_unique<kernels::Fp8BlockGemm>(workspace_.get(), workspace_.size());
  }
  void run(const OpEnv& env, int) override {
    kernels::quantize_fp8_rows(x_.get(), s_.m, s_.k, kGroup, x_q_.get(), x_s_.get(), env.stream, 1, s_.m);
    gemm_->run(env.stream, out_.get(), x_q_.get(), x_s_.get(), w_q_.get(), w_bs_.get(), s_.m, s_.n, s_.k);
  }
  OpCheck check(const OpEnv&, double tol) override {
    const int m = s_.m, n = s_.n, k = s_.k, groups = k / kGroup;
    const auto xq = x_q_.download<uint8_t>(), wq = w_q_.download<uint8_t>();
    const auto xs = x_s_.download<float>(), ws = w_rs_.download<float>();
    std::vector<double> x(static_cast<size_t>(m) * k), ref(static_cast<size_t>(m) * n);
    for (int i = 0; i < m; ++i)
      for (int c = 0; c < k; ++c)
        x[static_cast<size_t>(i) * k + c] =
            static_cast<double>(fp8_e4m3_to_f32(xq[static_cast<size_t>(i) * k + c])) *
            xs[static_cast<size_t>(c / kGroup) * m + i];
    parallel_for(n, [&](size_t j) {
      std::vector<double> w(k);
      for (int c = 0; c < k; ++c)
        w[c] = static_cast<double>(fp8_e4m3_to_f32(wq[j * k + c])) * ws[j * groups + c / kGroup];
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int c = 0; c < k; ++c) s += x[static_cast<size_t>(i) * k + c] * w[c];
        ref[static_cast<size_t>(i) * n + j] = s;
      }
    });
    OpCheck c;
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);
    return c;
  }
  // The weights once (e4m3), the activations read twice (bf16 to quantize, e4m3 to multiply) and
  // written once, the output.
  double bytes() const override {
    const double m = s_.m, n = s_.n, k = s_.k;
    return n * k + m * k * (2 + 1 + 1) + 2 * m * n;
  }
  double flops() const override { return 2.0 * s_.m * s_.n * s_.k; }

 private:
  // Multiplies element (r, c) of the [rows, cols] buffer by 2^exponent(r, c / 128).
  template <class Exponent>
  static void spread(const RandomBf16& buf, int rows, int cols, Exponent exponent) {
    std::vector<uint16_t> v = buf.current();
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        uint16_t& e = v[static_cast<size_t>(r) * cols + c];
        e = f2bf(std::ldexp(bf2f(e), exponent(r, c / kGroup)));
      }
    CUDA_CHECK(cudaMemcpy(buf.get(), v.data(), v.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }

  Fp8BlockGemmShape s_;
  RandomBf16 x_, w_;
  DevBuf<uint8_t> w_q_, x_q_, workspace_;
  DevBuf<float> w_rs_, w_bs_, x_s_;
  DevBuf<bf16> out_;
  std::unique_ptr<kernels::Fp8BlockGemm> gemm_;
};

}  // namespace

// Tolerance: fp32 sums of exact products and one bf16 rounding of the output (~2^-9 relative).
OpCaseDef fp8_block_gemm_case(const Fp8BlockGemmShape& s) {
  MB_CHECK(kernels::Fp8BlockGemm::takes(s.m, s.n, s.k), "fp8_block_gemm case: a shape the GEMM does not take");
  OpCaseDef d = op_case_def<Fp8BlockGemmCase>("linear fp8 w8a8 (cuBLASLt)",
                                              "m" + std::to_string(s.m) + " n" + std::to_string(s.n) + " k" +
                                                  std::to_string(s.k),
                                              OpFamily::gemm, 5e-3, s);
  d.format = WeightFormat::fp8_block;
  d.available = kernels::fp8_block_gemm_available;
  return d;
}

}  // namespace moebatch::ops
