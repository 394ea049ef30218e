// The qkv GEMV with the q/k norm, rope and cache write in its epilogue (kernels::gemv_stream_rope,
// and gemv_stream_combine_norm with a rope) against the two launches it replaces — gemv_stream
// (or gemv_stream_combine_norm) and then qk_norm_rope on its output — run on the GPU beside it:
// the row, both caches and the residual equal to the bit, every output finite, the head counters
// (and the norm's ticket) back at zero; then a second launch on the same counters, which must
// give the same bits again (a counter left nonzero would complete its head early or never).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/gemv_stream.cuh"
#include "kernels/rope.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

using std::to_string;

class GemvRopeCase final : public OpCase {
 public:
  explicit GemvRopeCase(const GemvRopeShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int H = s_.hidden, n = row_width(), hd = s_.head_dim;
    w_ = RandomBf16(static_cast<size_t>(n) * H, 0.05f, rng, env.stream);
    const int64_t copies =
        s_.rotate_bytes > 0
            ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(s_.rotate_bytes / (2.0 * n * H))))
            : 1;
    w_copies_.clear();
    for (int64_t j = 1; j < copies; ++j) {
      w_copies_.emplace_back(static_cast<size_t>(n) * H);
      CUDA_CHECK(cudaMemcpyAsync(w_copies_.back().get(), w_.get(), w_.size() * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, env.stream));
    }
    if (s_.combine_norm) {
      y_ = RandomBf16(static_cast<size_t>(s_.top_k) * H, 2.f, rng, env.stream);
      res_ = RandomBf16(H, 2.f, rng, env.stream);
      nw_ = RandomBf16(H, 1.5f, rng, env.stream);
      cw_.resize(s_.top_k);
      for (auto& v : cw_) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
      d_cw_ = DevBuf<float>(cw_);
      res_init_ = DevBuf<bf16>(H);
      CUDA_CHECK(cudaMemcpyAsync(res_init_.get(), res_.get(), H * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, env.stream));
      norm_counter_ = DevBuf<uint32_t>(std::vector<uint32_t>{0});
    } else {
      x_ = RandomBf16(H, 1.f, rng, env.stream);
    }
    if (s_.norm) {
      qn_ = RandomBf16(hd, 1.5f, rng, env.stream);
      kn_ = RandomBf16(hd, 1.5f, rng, env.stream);
    }
    d_pos_ =
        DevBuf<int32_t>(std::vector<int32_t>{std::uniform_int_distribution<int>(1, 40000)(rng)});
    if (s_.table) {  // as a forward does: once for all its layers
      table_ = DevBuf<float2>(static_cast<size_t>(rotated_dims() / 2));
      kernels::rope_rotation_table(d_pos_.get(), 1, rotated_dims(), kTheta, table_.get(),
                                   env.stream);
    }
    if (s_.cache) {
      kc_ = RandomBf16(static_cast<size_t>(kSlots) * s_.n_kv_heads * hd, 1.f, rng, env.stream);
      vc_ = RandomBf16(kc_.size(), 1.f, rng, env.stream);
      d_slot_ = DevBuf<int32_t>(std::vector<int32_t>{kSlot});
    }
    counters_ = DevBuf<uint32_t>(std::vector<uint32_t>(s_.n_q_heads + 2 * s_.n_kv_heads, 0));
    out_ = DevBuf<bf16>(n);
    out_.poison();
    kernels::gemv_stream_prepare();
  }
  void run(const OpEnv& env, int iter) override {
    // the residual as set up: each launch adds the combine into it once
    if (s_.combine_norm)
      CUDA_CHECK(cudaMemcpyAsync(res_.get(), res_init_.get(), s_.hidden * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, env.stream));
    const size_t copies = w_copies_.size() + 1, j = static_cast<size_t>(iter) % copies;
    const bf16* w = j == 0 ? w_.get() : w_copies_[j - 1].get();
    const kernels::QkNormRopeParams p = rope(out_.get(), kc_.get(), vc_.get());
    if (s_.combine_norm)
      kernels::gemv_stream_combine_norm(out_.get(), combine(), norm(res_.get()),
                                        norm_counter_.get(), w, row_width(), s_.hidden, env.stream,
                                        false, &p, counters_.get());
    else
      kernels::gemv_stream_rope(out_.get(), x_.get(), w, row_width(), s_.hidden, p, counters_.get(),
                                env.stream);
  }
  OpCheck check(const OpEnv& env, double) override {
    const Outputs want = separate_launches(env);
    OpCheck c;
    compare(c, "", want);
    // Again on the same counters, the outputs poisoned and the caches as set up.
    out_.poison();
    if (s_.cache)
      for (const RandomBf16* cache : {&kc_, &vc_}) {
        const std::vector<uint16_t> original = cache->original(env.stream);
        CUDA_CHECK(cudaMemcpy(cache->get(), original.data(), original.size() * sizeof(uint16_t),
                              cudaMemcpyHostToDevice));
      }
    run(env, 0);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    compare(c, "second launch: ", want);
    return c;
  }
  // W once, x (or the combine's rows, residual and norm weight), the row written, q and k read
  // back and written again, k and v to the cache
  double bytes() const override {
    const double H = s_.hidden, n = row_width(),
                 kv = static_cast<double>(s_.n_kv_heads) * s_.head_dim;
    const double x = s_.combine_norm ? 2.0 * (s_.top_k + 3) * H : 2.0 * H;
    return 2.0 * n * H + x + 2.0 * n + 4.0 * (s_.n_q_heads * s_.head_dim + kv) +
           (s_.cache ? 2.0 * kv + 4.0 * kv : 0.0);
  }
  double flops() const override { return 2.0 * row_width() * s_.hidden; }

 private:
  static constexpr float kTheta = 1e6f, kEps = 1e-6f;
  static constexpr int kSlots = 8, kSlot = 5;  // a nonzero slot of a small pool
  struct Outputs {
    std::vector<uint16_t> row, k_cache, v_cache, residual;
  };
  int row_width() const {
    return ((s_.gate ? 2 : 1) * s_.n_q_heads + 2 * s_.n_kv_heads) * s_.head_dim;
  }
  int rotated_dims() const { return kernels::rope_rotated_dims(s_.rotary_dim, s_.head_dim); }
  kernels::QkNormRopeParams rope(bf16* row, bf16* k_cache, bf16* v_cache) const {
    kernels::QkNormRopeParams p;
    const int hd = s_.head_dim;
    p.q = row;
    p.k = row + s_.n_q_heads * hd;
    p.q_stride = p.k_stride = row_width();
    p.q_norm = s_.norm ? qn_.get() : nullptr;
    p.k_norm = s_.norm ? kn_.get() : nullptr;
    p.positions = d_pos_.get();
    p.rotation = s_.table ? table_.get() : nullptr;
    p.tokens = 1;
    p.n_q_heads = s_.n_q_heads;
    p.n_kv_heads = s_.n_kv_heads;
    p.head_dim = hd;
    p.rotary_dim = s_.rotary_dim;
    p.theta = kTheta;
    p.eps = kEps;
    p.norm_offset = s_.norm_offset;
    if (s_.cache) {
      p.k_cache = k_cache;
      p.v_cache = v_cache;
      p.v = row + (s_.n_q_heads + s_.n_kv_heads) * hd;
      p.v_stride = row_width();
      p.slot_mapping = d_slot_.get();
    }
    return p;
  }
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
    n.weight_offset = s_.norm_offset;
    return n;
  }
  // gemv_stream(_combine_norm) and then qk_norm_rope on fresh buffers holding the inputs as set
  // up (W copy 0, as run(env, 0) takes).
  Outputs separate_launches(const OpEnv& env) const {
    const int n = row_width();
    DevBuf<bf16> row(n);
    row.poison();
    DevBuf<bf16> kc, vc, res;
    if (s_.cache) {
      kc = DevBuf<bf16>(kc_.original(env.stream));
      vc = DevBuf<bf16>(vc_.original(env.stream));
    }
    if (s_.combine_norm) {
      res = DevBuf<bf16>(static_cast<size_t>(s_.hidden));
      CUDA_CHECK(cudaMemcpyAsync(res.get(), res_init_.get(), s_.hidden * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, env.stream));
      DevBuf<uint32_t> ticket(std::vector<uint32_t>{0});
      kernels::gemv_stream_combine_norm(row.get(), combine(), norm(res.get()), ticket.get(),
                                        w_.get(), n, s_.hidden, env.stream);
      CUDA_CHECK(cudaStreamSynchronize(env.stream));
    } else {
      kernels::gemv_stream(row.get(), x_.get(), w_.get(), 1, n, s_.hidden, env.stream);
    }
    kernels::qk_norm_rope(rope(row.get(), kc.get(), vc.get()), env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    Outputs o;
    o.row = row.download<uint16_t>();
    if (s_.cache) {
      o.k_cache = kc.download<uint16_t>();
      o.v_cache = vc.download<uint16_t>();
    }
    if (s_.combine_norm) o.residual = res.download<uint16_t>();
    return o;
  }
  void compare(OpCheck& c, const std::string& when, const Outputs& want) const {
    const std::vector<uint16_t> row = out_.download<uint16_t>();
    c.equal(when + "row vs gemv_stream + qk_norm_rope", row, want.row);
    c.expect(std::all_of(row.begin(), row.end(), [](uint16_t b) { return std::isfinite(bf2f(b)); }),
             when + "every output finite");
    if (s_.cache) {
      c.equal(when + "k cache", kc_.current(), want.k_cache);
      c.equal(when + "v cache", vc_.current(), want.v_cache);
    }
    if (s_.combine_norm) {
      c.equal(when + "residual", res_.current(), want.residual);
      c.expect(norm_counter_.download<uint32_t>()[0] == 0, when + "norm ticket back at zero");
    }
    const std::vector<uint32_t> counters = counters_.download<uint32_t>();
    c.expect(std::all_of(counters.begin(), counters.end(), [](uint32_t v) { return v == 0; }),
             when + "head counters back at zero");
  }

  GemvRopeShape s_;
  RandomBf16 w_, x_, y_, res_, nw_, qn_, kn_, kc_, vc_;
  std::vector<DevBuf<bf16>> w_copies_;  // run(env, i) takes copy i % (1 + size); 0 is w_
  std::vector<float> cw_;
  DevBuf<float> d_cw_;
  DevBuf<bf16> res_init_, out_;
  DevBuf<uint32_t> norm_counter_, counters_;
  DevBuf<int32_t> d_pos_, d_slot_;
  DevBuf<float2> table_;
};

}  // namespace

OpCaseDef gemv_rope_case(const GemvRopeShape& s) {
  MB_CHECK(s.hidden > 0 && s.hidden % 8 == 0 &&
               (!s.combine_norm || (s.top_k > 0 && s.hidden <= kernels::kGemvCombineNormMaxK)),
           "gemv_rope case: hidden a multiple of 8 (up to kGemvCombineNormMaxK with the combine)");
  std::string shape = "H" + to_string(s.hidden) + " q" + to_string(s.n_q_heads) + "/kv" +
                      to_string(s.n_kv_heads) + " d" + to_string(s.head_dim);
  if (s.rotary_dim > 0) shape += " rot" + to_string(s.rotary_dim);
  if (s.combine_norm) shape += " combine-k" + to_string(s.top_k);
  if (!s.norm) shape += " no-norm";
  if (s.norm_offset != 0.f) shape += " 1+w";
  if (s.gate) shape += " gate";
  if (!s.table) shape += " no-table";
  if (!s.cache) shape += " no-cache";
  OpCaseDef d = op_case_def<GemvRopeCase>(
      s.combine_norm ? "gemv_stream_combine_norm+rope" : "gemv_stream_rope", std::move(shape),
      OpFamily::quant, 0, s);
  d.available = &kernels::gemv_stream_available;
  return d;
}

}  // namespace moebatch::ops
