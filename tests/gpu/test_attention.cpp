// Paged causal GQA attention (prefill and decode paths, split-K) against an fp64 reference over
// a randomly paged cache: random block tables, mixed query/context lengths.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/attention.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch::test {
namespace {

using namespace moebatch::kernels;

class AttentionTest : public GpuTest {
 protected:
  // q_lens[s] new tokens at the end of kv_lens[s] positions per sequence.
  void run_case(int head_dim, int nq, int nkv, const std::vector<int>& q_lens,
                const std::vector<int>& kv_lens, bool decode_path, int splits) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " splits " + std::to_string(splits) +
                 (decode_path ? " decode" : " prefill"));
    const int bs = 16, num_seqs = static_cast<int>(q_lens.size());
    const int max_kv = *std::max_element(kv_lens.begin(), kv_lens.end());
    const int max_q = *std::max_element(q_lens.begin(), q_lens.end());
    const int max_blocks = (max_kv + bs - 1) / bs;
    const int num_blocks = num_seqs * max_blocks + 3;
    const int width = nkv * head_dim;
    std::vector<int32_t> q_start(num_seqs + 1, 0);
    for (int s = 0; s < num_seqs; ++s) q_start[s + 1] = q_start[s] + q_lens[s];
    const int tokens = q_start[num_seqs];
    // Random physical blocks: a permutation shared out to the sequences' tables.
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, 0);
    for (int s = 0, next = 0; s < num_seqs; ++s)
      for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = perm[next++];
    const int64_t q_stride = static_cast<int64_t>(nq) * head_dim + 8;  // q inside a wider row
    auto q = random_bf16(rng, static_cast<size_t>(tokens) * q_stride, 1.5f);
    auto kc = random_bf16(rng, static_cast<size_t>(num_blocks) * bs * width, 1.5f);
    auto vc = random_bf16(rng, kc.size(), 1.f);
    DevBuf<bf16> d_q(q), d_kc(kc), d_vc(vc), d_out(static_cast<size_t>(tokens) * nq * head_dim);
    DevBuf<int32_t> d_tables(tables), d_qs(q_start), d_kvl(std::vector<int32_t>(kv_lens.begin(), kv_lens.end()));
    DevBuf<float> d_ws(std::max<size_t>(1, attention_workspace_floats(tokens, nq, head_dim, splits)));
    d_out.poison();
    d_ws.poison();
    AttentionParams p;
    p.out = d_out.get();
    p.q = d_q.get();
    p.q_stride = q_stride;
    p.k_cache = d_kc.get();
    p.v_cache = d_vc.get();
    p.block_tables = d_tables.get();
    p.q_start = d_qs.get();
    p.kv_lens = d_kvl.get();
    p.num_seqs = num_seqs;
    p.num_tokens = tokens;
    p.max_q_len = max_q;
    p.max_kv_len = max_kv;
    p.max_blocks_per_seq = max_blocks;
    p.block_size = bs;
    p.n_q_heads = nq;
    p.n_kv_heads = nkv;
    p.head_dim = head_dim;
    p.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    p.num_splits = splits;
    p.workspace = d_ws.get();
    if (decode_path) attention_decode(p, stream); else attention_prefill(p, stream);
    sync();

    std::vector<double> ref(d_out.size());
    const int group = nq / nkv;
    for (int s = 0; s < num_seqs; ++s) {
      for (int i = 0; i < q_lens[s]; ++i) {
        const int tok = q_start[s] + i, pos = kv_lens[s] - q_lens[s] + i;
        for (int h = 0; h < nq; ++h) {
          const int kvh = h / group;
          std::vector<double> sc(pos + 1);
          double mx = -1e300;
          for (int j = 0; j <= pos; ++j) {
            const size_t slot = static_cast<size_t>(tables[s * max_blocks + j / bs]) * bs + j % bs;
            double dot = 0;
            for (int d = 0; d < head_dim; ++d)
              dot += static_cast<double>(bf2f(q[tok * q_stride + h * head_dim + d])) *
                     bf2f(kc[(slot * nkv + kvh) * head_dim + d]);
            sc[j] = dot * p.scale;
            mx = std::max(mx, sc[j]);
          }
          double den = 0;
          for (auto& v : sc) den += (v = std::exp(v - mx));
          for (int d = 0; d < head_dim; ++d) {
            double o = 0;
            for (int j = 0; j <= pos; ++j) {
              const size_t slot = static_cast<size_t>(tables[s * max_blocks + j / bs]) * bs + j % bs;
              o += sc[j] * bf2f(vc[(slot * nkv + kvh) * head_dim + d]);
            }
            ref[(static_cast<size_t>(tok) * nq + h) * head_dim + d] = o / den;
          }
        }
      }
    }
    // bf16 output rounding dominates (fp32 scores and accumulation).
    EXPECT_TRUE(close_rel_l2(to_float(d_out.download<uint16_t>()), ref, 5e-3));
  }
};

TEST_F(AttentionTest, PrefillFullAndChunkedSequences) {
  SCOPED_TRACE(trace());
  // Whole prompts, a chunk continuing a cached prefix, and a decode token in one step.
  run_case(128, 32, 4, {37, 64, 20, 1}, {37, 64, 85, 130}, false, 1);
  run_case(32, 8, 4, {50, 3}, {50, 40}, false, 1);
  run_case(16, 8, 4, {17, 33}, {17, 33}, false, 1);
  run_case(64, 16, 16, {40}, {90}, false, 2);
}

TEST_F(AttentionTest, DecodeManySequencesDifferentLengths) {
  SCOPED_TRACE(trace());
  std::vector<int> q(23, 1), kv(23);
  for (auto& v : kv) v = std::uniform_int_distribution<int>(1, 700)(rng);
  kv[0] = 1;
  kv[1] = 16;
  kv[2] = 17;
  run_case(128, 32, 4, q, kv, true, 1);
  run_case(32, 8, 4, q, kv, true, 1);
}

TEST_F(AttentionTest, DecodeSplitKMatchesSingleSplit) {
  SCOPED_TRACE(trace());
  std::vector<int> q(5, 1), kv = {1500, 3, 800, 257, 1024};
  run_case(128, 32, 4, q, kv, true, 7);
  run_case(128, 32, 4, q, kv, true, attention_decode_splits(5, 4, 1500, 132, 32));
  run_case(16, 8, 4, q, kv, true, 4);
}

}  // namespace
}  // namespace moebatch::test
