// Cases of paged causal GQA attention (prefill and decode paths, split-K) against an fp64
// reference over a randomly paged cache: random block tables, mixed query/context lengths.
// Decode cases also launch a second time on fresh NaN outputs (a step replayed from a CUDA
// graph), which must give the same bits, with split-K's ticket counters back at zero.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "kernels/attention.cuh"
#include "kernels/rope.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

class AttentionCase final : public OpCase {
 public:
  explicit AttentionCase(const AttentionShape& s) : s_(s) {}

  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads;
    const int num_seqs = static_cast<int>(s_.q_lens.size());
    const int bs = s_.block_size;
    kv_lens_ = s_.kv_lens;
    for (auto& v : kv_lens_) {
      if (v == 0) v = std::uniform_int_distribution<int>(1, s_.random_kv_max)(rng);
      if (v == kEmptyContext) v = 0;
    }
    const int max_kv = std::max(*std::max_element(kv_lens_.begin(), kv_lens_.end()), s_.kv_bound);
    const int max_q = *std::max_element(s_.q_lens.begin(), s_.q_lens.end());
    max_blocks_ = std::max(1, (max_kv + bs - 1) / bs);
    const int num_blocks = num_seqs * max_blocks_ + 3;
    q_start_.assign(num_seqs + 1, 0);
    for (int s = 0; s < num_seqs; ++s) q_start_[s + 1] = q_start_[s] + s_.q_lens[s];
    const int tokens = q_start_[num_seqs];
    // Random physical blocks: a permutation shared out to the sequences' tables.
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables_.assign(static_cast<size_t>(num_seqs) * max_blocks_, 0);
    for (int s = 0, next = 0; s < num_seqs; ++s)
      for (int b = 0; b < max_blocks_; ++b) tables_[s * max_blocks_ + b] = perm[next++];
    q_stride_ = static_cast<int64_t>(raw_qkv() ? nq + 2 * nkv : nq) * hd + s_.q_pad;
    q_ = RandomBf16(static_cast<size_t>(tokens) * q_stride_, 1.5f, rng, env.stream);
    kc_ = RandomBf16(static_cast<size_t>(num_blocks) * bs * nkv * hd, 1.5f, rng, env.stream);
    vc_ = RandomBf16(kc_.size(), 1.f, rng, env.stream);
    out_ = DevBuf<bf16>(static_cast<size_t>(tokens) * nq * hd);
    d_tables_ = DevBuf<int32_t>(tables_);
    d_q_start_ = DevBuf<int32_t>(q_start_);
    d_kv_lens_ = DevBuf<int32_t>(std::vector<int32_t>(kv_lens_.begin(), kv_lens_.end()));
    splits_ = s_.splits == kSplitsAuto ? kernels::attention_decode_splits(
                                             num_seqs, nkv, max_kv, env.num_sms, kAttnMaxSplits)
                                       : s_.splits;
    ws_ = DevBuf<float>(std::max<size_t>(1, kernels::attention_workspace_floats(tokens, nq, hd, splits_)));
    out_.poison();
    ws_.poison();
    zero_counters();

    p_ = {};
    p_.out = out_.get();
    p_.q = q_.get();
    p_.q_stride = q_stride_;
    p_.k_cache = kc_.get();
    p_.v_cache = vc_.get();
    p_.block_tables = d_tables_.get();
    p_.q_start = d_q_start_.get();
    p_.kv_lens = d_kv_lens_.get();
    p_.num_seqs = num_seqs;
    p_.num_tokens = tokens;
    p_.max_q_len = max_q;
    p_.max_kv_len = max_kv;
    p_.max_blocks_per_seq = max_blocks_;
    p_.block_size = bs;
    p_.n_q_heads = nq;
    p_.n_kv_heads = nkv;
    p_.head_dim = hd;
    p_.scale = 1.f / std::sqrt(static_cast<float>(hd));
    p_.num_splits = splits_;
    p_.workspace = ws_.get();
    p_.cluster_merge = s_.cluster_merge;
    if (s_.mma_sync) p_.prefill_kernel = kernels::AttentionPrefillKernel::mma_sync;
    p_.max_blocks = s_.max_blocks;
    if (raw_qkv()) setup_rope(env, rng);
  }

  void run(const OpEnv& env, int) override {
    if (s_.decode) kernels::attention_decode(p_, env.stream); else kernels::attention_prefill(p_, env.stream);
  }

  OpCheck check(const OpEnv& env, double tol) override {
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, group = nq / nkv;
    const auto q = q_.original(env.stream), kc = kc_.original(env.stream), vc = vc_.original(env.stream);
    // With the fused rope: every (token, head) q row and new k row normalised and rotated in fp64
    // (new_k), the new v raw; they replace q and the cache rows at each sequence's last position.
    // With rope_q the q rows alone (the cache holds every key already).
    const int rows_per_token = raw_qkv() ? nq + nkv : 0;
    std::vector<double> roped(static_cast<size_t>(p_.num_tokens) * rows_per_token * hd);
    if (raw_qkv()) rope_ref(q, roped, env.stream);
    auto q_at = [&](int tok, int h, int d) {
      return raw_qkv() ? roped[(static_cast<size_t>(tok) * rows_per_token + h) * hd + d]
                       : static_cast<double>(bf2f(q[tok * q_stride_ + h * hd + d]));
    };
    std::vector<double> ref(out_.size());
    // (token, head) rows: each writes its own head_dim outputs.
    std::vector<std::pair<int, int>> rows;  // (sequence, query index)
    for (int s = 0; s < p_.num_seqs; ++s)
      for (int i = 0; i < s_.q_lens[s]; ++i) rows.emplace_back(s, i);
    parallel_for(rows.size() * nq, [&](size_t r) {
      const int s = rows[r / nq].first, i = rows[r / nq].second;
      const int h = static_cast<int>(r % nq), kvh = h / group;
      const int tok = q_start_[s] + i, pos = kv_lens_[s] - s_.q_lens[s] + i;
      double* out_row = &ref[(static_cast<size_t>(tok) * nq + h) * hd];
      if (pos < 0) {  // an empty context: zeros
        std::fill(out_row, out_row + hd, 0.0);
        return;
      }
      const int bs = s_.block_size;
      auto slot = [&](int j) {
        return static_cast<size_t>(tables_[s * max_blocks_ + j / bs]) * bs + j % bs;
      };
      // the key and value rows of position j (the new token's own when the kernel writes them)
      const bool fresh = s_.fused_rope && slots_[tok] >= 0;
      auto key = [&](int j, int d) {
        return fresh && j == pos ? roped[(static_cast<size_t>(tok) * rows_per_token + nq + kvh) * hd + d]
                                 : static_cast<double>(bf2f(kc[(slot(j) * nkv + kvh) * hd + d]));
      };
      auto value = [&](int j, int d) {
        return static_cast<double>(bf2f(fresh && j == pos ? q[tok * q_stride_ + (nq + nkv + kvh) * hd + d]
                                                          : vc[(slot(j) * nkv + kvh) * hd + d]));
      };
      std::vector<double> sc(pos + 1);
      double mx = -1e300;
      for (int j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += q_at(tok, h, d) * key(j, d);
        sc[j] = dot * p_.scale;
        mx = std::max(mx, sc[j]);
      }
      double den = 0;
      for (auto& v : sc) den += (v = std::exp(v - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int j = 0; j <= pos; ++j) o += sc[j] * value(j, d);
        out_row[d] = o / den;
      }
    });
    OpCheck c;
    if (s_.cluster_merge && splits_ >= 2 && splits_ <= kernels::kAttentionClusterMaxSplits) {
      int device = 0, clusters = 0;
      CUDA_CHECK(cudaGetDevice(&device));
      CUDA_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device));
      c.expect(kernels::attention_decode_merges_in_clusters(p_) == (clusters != 0),
               "the splits were not merged across a cluster where the GPU launches clusters");
    }
    // bf16 output rounding dominates (fp32 scores and accumulation).
    const std::vector<uint16_t> out = out_.download<uint16_t>();
    const std::vector<float> outf = to_float(out);
    c.rel_l2("out", outf, ref, tol);
    if (s_.fused_rope) check_cache(kc, vc, q, roped, tol, c);
    if (s_.rope_q) check_rope_q(env, q, out, c);
    if (std::count(kv_lens_.begin(), kv_lens_.end(), 0) > 0) {
      bool zero = true;
      for (int s = 0; s < p_.num_seqs; ++s)
        if (kv_lens_[s] == 0)
          for (size_t i = static_cast<size_t>(q_start_[s]) * nq * hd;
               i < static_cast<size_t>(q_start_[s + 1]) * nq * hd; ++i)
            zero = zero && outf[i] == 0.f;
      c.expect(zero, "empty contexts give zero rows");
    }
    if (s_.decode) {
      if (splits_ > 1) {
        const std::vector<uint32_t> words = ws_.download<uint32_t>();
        c.expect(std::all_of(words.begin(), words.begin() + kernels::kAttentionCounters,
                             [](uint32_t w) { return w == 0; }),
                 "split-K ticket counters back to zero");
      }
      // Again as a graph replays it: outputs and partials NaN, the counters as the launch left
      // them.
      out_.poison();
      if (splits_ > 1)
        CUDA_CHECK(cudaMemset(ws_.get() + kernels::kAttentionCounters, 0xff,
                              (ws_.size() - kernels::kAttentionCounters) * sizeof(float)));
      run(env, 0);
      CUDA_CHECK(cudaStreamSynchronize(env.stream));
      c.expect(out_.download<uint16_t>() == out, "a second launch gives the same output");
    }
    return c;
  }

  // every sequence's K and V rows once, q read and out written
  double bytes() const override {
    double kv = 0;
    for (int v : kv_lens_) kv += v;
    const double width = static_cast<double>(s_.n_kv_heads) * s_.head_dim;
    return 4.0 * kv * width + 4.0 * p_.num_tokens * s_.n_q_heads * s_.head_dim;
  }
  // q·k and p·v: 4 flops per (query, key, dim), keys up to the query's position
  double flops() const override {
    double keys = 0;
    for (size_t s = 0; s < s_.q_lens.size(); ++s)
      for (int i = 0; i < s_.q_lens[s]; ++i) keys += kv_lens_[s] - s_.q_lens[s] + i + 1;
    return 4.0 * keys * s_.n_q_heads * s_.head_dim;
  }
  std::string note() const override { return s_.decode ? "splits " + std::to_string(splits_) : ""; }

 private:
  static constexpr float kTheta = 1e6f, kEps = 1e-6f;

  // q (and with the fused rope the new k / v) raw in fused qkv rows.
  bool raw_qkv() const { return s_.fused_rope || s_.rope_q; }

  // The rope's operands as the engine passes them: each token's position (decode: kv_len - 1;
  // prefill: kv_len - q_len + its index), the forward's rotation table, random norm weights, and
  // with the fused rope each new token's slot (that of its position in the block table; none
  // for an empty context).
  void setup_rope(const OpEnv& env, std::mt19937& rng) {
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, tokens = p_.num_tokens;
    std::vector<int32_t> pos(tokens, 0);
    slots_.assign(tokens, -1);
    for (int s = 0; s < p_.num_seqs; ++s) {
      if (s_.rope_q) {
        for (int i = 0; i < s_.q_lens[s]; ++i) pos[q_start_[s] + i] = kv_lens_[s] - s_.q_lens[s] + i;
        continue;
      }
      const int tok = q_start_[s], last = kv_lens_[s] - 1;
      if (last < 0) continue;
      pos[tok] = last;
      slots_[tok] = tables_[s * max_blocks_ + last / s_.block_size] * s_.block_size + last % s_.block_size;
    }
    positions_ = pos;
    d_pos_ = DevBuf<int32_t>(pos);
    d_slots_ = DevBuf<int32_t>(slots_);
    rotation_ = DevBuf<float2>(static_cast<size_t>(tokens) * (hd / 2));
    kernels::rope_rotation_table(d_pos_.get(), tokens, hd, kTheta, rotation_.get(), env.stream);
    if (s_.rope_norm) {
      qn_ = RandomBf16(hd, 1.5f, rng, env.stream);
      kn_ = RandomBf16(hd, 1.5f, rng, env.stream);
    }
    kernels::QkNormRopeParams& r = p_.rope;
    r = {};
    r.q = q_.get();
    r.k = q_.get() + static_cast<size_t>(nq) * hd;
    r.q_stride = r.k_stride = r.v_stride = q_stride_;
    r.q_norm = s_.rope_norm ? qn_.get() : nullptr;
    r.k_norm = s_.rope_norm ? kn_.get() : nullptr;
    r.positions = d_pos_.get();
    r.rotation = rotation_.get();
    r.tokens = tokens;
    r.n_q_heads = nq;
    r.n_kv_heads = nkv;
    r.head_dim = hd;
    r.theta = kTheta;
    r.eps = kEps;
    r.k_cache = kc_.get();
    r.v_cache = vc_.get();
    r.v = q_.get() + static_cast<size_t>(nq + nkv) * hd;
    r.slot_mapping = d_slots_.get();
    if (s_.rope_q) {
      r.k_cache = r.v_cache = nullptr;  // the keys are in the cache already
      p_.rope_q = true;
      return;
    }
    p_.fused_rope = true;
    MB_CHECK(kernels::attention_decode_fuses_rope(p_),
             "attention case: the decode kernels cannot fuse this rope (the warp kernel only: >= 512 pairs, one split)");
  }

  // rope_q: where the attention kernel rotates q itself (attention_prefill_rotates_q), it leaves
  // the q rows as they were and gives the bits of a q-only qk_norm_rope launch followed by plain
  // attention (the same arithmetic, kernels/rope_device.cuh), run here on a copy.
  void check_rope_q(const OpEnv& env, const std::vector<uint16_t>& q, const std::vector<uint16_t>& out,
                    OpCheck& c) const {
    if (!kernels::attention_prefill_rotates_q(p_)) return;
    c.equal("q rows untouched", q_.current(), q);
    DevBuf<bf16> q2(q.size()), out2(out_.size());
    CUDA_CHECK(cudaMemcpyAsync(q2.get(), q_.get(), q.size() * sizeof(bf16), cudaMemcpyDeviceToDevice, env.stream));
    kernels::AttentionParams plain = p_;
    plain.q = plain.rope.q = q2.get();
    plain.out = out2.get();
    kernels::qk_norm_rope(kernels::qk_norm_rope_q_only(plain.rope), env.stream);
    plain.rope_q = false;
    kernels::attention_prefill(plain, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    c.equal("out against qk_norm_rope then attention", out2.download<uint16_t>(), out);
  }

  // roped[(token · (nq + nkv) + row) · hd + d]: q heads then k heads, normalised and rotated in
  // fp64 from the raw rows (qk_norm_rope's reference).
  void rope_ref(const std::vector<uint16_t>& q, std::vector<double>& roped, cudaStream_t stream) const {
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, half = hd / 2;
    const std::vector<uint16_t> qn = s_.rope_norm ? qn_.original(stream) : std::vector<uint16_t>{};
    const std::vector<uint16_t> kn = s_.rope_norm ? kn_.original(stream) : std::vector<uint16_t>{};
    for (int tok = 0; tok < p_.num_tokens; ++tok)
      for (int row = 0; row < nq + nkv; ++row) {
        const uint16_t* x = &q[tok * q_stride_ + static_cast<int64_t>(row) * hd];
        const std::vector<uint16_t>& w = row < nq ? qn : kn;
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += std::pow(static_cast<double>(bf2f(x[d])), 2);
        const double rstd = s_.rope_norm ? 1.0 / std::sqrt(ss / hd + kEps) : 1.0;
        auto normed = [&](int d) { return bf2f(x[d]) * rstd * (s_.rope_norm ? bf2f(w[d]) : 1.0); };
        double* out = &roped[(static_cast<size_t>(tok) * (nq + nkv) + row) * hd];
        for (int i = 0; i < half; ++i) {
          const double a = normed(i), b = normed(i + half);
          const double ang = positions_[tok] * std::pow(static_cast<double>(kTheta), -2.0 * i / hd);
          out[i] = a * std::cos(ang) - b * std::sin(ang);
          out[i + half] = b * std::cos(ang) + a * std::sin(ang);
        }
      }
  }

  // The new tokens' cache slots: k as rotated (fp64, within tol), v bit-exact; every other slot
  // untouched.
  void check_cache(const std::vector<uint16_t>& kc, const std::vector<uint16_t>& vc,
                   const std::vector<uint16_t>& q, const std::vector<double>& roped, double tol, OpCheck& c) const {
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, width = nkv * hd;
    std::vector<uint16_t> k_now = kc_.current(), v_now = vc_.current(), k_want = kc, v_want = vc;
    std::vector<float> k_got;
    std::vector<double> k_ref;
    for (int tok = 0; tok < p_.num_tokens; ++tok) {
      if (slots_[tok] < 0) continue;
      const size_t at = static_cast<size_t>(slots_[tok]) * width;
      for (int i = 0; i < width; ++i) {
        k_got.push_back(bf2f(k_now[at + i]));
        k_ref.push_back(roped[(static_cast<size_t>(tok) * (nq + nkv) + nq) * hd + i]);
        k_want[at + i] = k_now[at + i];  // compared above
        v_want[at + i] = q[tok * q_stride_ + static_cast<int64_t>(nq + nkv) * hd + i];
      }
    }
    c.rel_l2("new k in the cache", k_got, k_ref, tol);
    c.equal("k cache elsewhere", k_now, k_want);
    c.equal("v cache", v_now, v_want);
  }

  // The workspace's ticket counters start at zero (the engine zeroes them once at allocation).
  void zero_counters() {
    if (splits_ > 1)
      CUDA_CHECK(cudaMemset(ws_.get(), 0, kernels::kAttentionCounters * sizeof(uint32_t)));
  }

  AttentionShape s_;
  std::vector<int> kv_lens_;
  std::vector<int32_t> q_start_, tables_;
  int max_blocks_ = 0, splits_ = 1;
  int64_t q_stride_ = 0;
  RandomBf16 q_, kc_, vc_, qn_, kn_;
  DevBuf<bf16> out_;
  DevBuf<int32_t> d_tables_, d_q_start_, d_kv_lens_, d_pos_, d_slots_;
  std::vector<int32_t> positions_, slots_;
  DevBuf<float2> rotation_;
  DevBuf<float> ws_;
  kernels::AttentionParams p_;
};

// "37,64,20,1", or "1-700" / "x23 192" style summaries for long or uniform lists.
std::string lens(const std::vector<int>& v, int random_max) {
  const auto len = [](int x) {
    return x == kEmptyContext ? std::string("empty") : std::to_string(x);
  };
  const bool uniform = std::all_of(v.begin(), v.end(), [&](int x) { return x == v[0]; });
  if (uniform && v[0] == 0) return "1-" + std::to_string(random_max);
  if (uniform) return len(v[0]);
  if (v.size() > 6) return "mixed" + std::string(random_max > 0 ? "1-" + std::to_string(random_max) : "");
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + len(x);
  return s;
}

}  // namespace

OpCaseDef attention_case(const AttentionShape& s) {
  MB_CHECK(!s.q_lens.empty() && s.q_lens.size() == s.kv_lens.size(), "attention case: one q and kv length per sequence");
  for (size_t i = 0; i < s.q_lens.size(); ++i) {
    const int q = s.q_lens[i], kv = s.kv_lens[i];
    MB_CHECK(q >= 1 && (kv == kEmptyContext ? s.decode && q == 1
                        : kv == 0           ? s.random_kv_max >= q
                                            : kv >= q),
             "attention case: every sequence needs kv_len >= q_len >= 1 (or an empty context of a "
             "decode token)");
  }
  MB_CHECK(s.block_size > 0 && s.kv_bound >= 0 && s.max_blocks >= 0, "attention case: bad block size, kv bound or block cap");
  MB_CHECK(!s.fused_rope || (s.decode && s.q_pad % 8 == 0), "attention case: the fused rope is a decode case with 16-byte rows");
  MB_CHECK(!s.rope_q || (!s.decode && !s.fused_rope && s.q_pad % 8 == 0),
           "attention case: rope_q is a prefill case with 16-byte rows");
  const std::string shape =
      "d" + std::to_string(s.head_dim) + " q" + std::to_string(s.n_q_heads) + "/kv" +
      std::to_string(s.n_kv_heads) + " seqs" + std::to_string(s.q_lens.size()) + " qlen " +
      lens(s.q_lens, 0) + " kvlen " + lens(s.kv_lens, s.random_kv_max) + " splits " +
      (s.splits == kSplitsAuto ? std::string("auto") : std::to_string(s.splits)) +
      (s.kv_bound > 0 ? " bound " + std::to_string(s.kv_bound) : "") +
      (s.block_size != 16 ? " block " + std::to_string(s.block_size) : "") + (s.mma_sync ? " mma_sync" : "") +
      (s.max_blocks > 0 ? " blocks" + std::to_string(s.max_blocks) : "") +
      (s.fused_rope ? (s.rope_norm ? " fused_rope" : " fused_rope no_norm") : "") +
      (s.rope_q ? (s.rope_norm ? " rope_q" : " rope_q no_norm") : "") +
      (s.cluster_merge ? " cluster_merge" : "");
  return op_case_def<AttentionCase>(s.decode ? "attn_decode" : "attn_prefill", shape, OpFamily::attention, 5e-3, s);
}

}  // namespace moebatch::ops
