#include "engine/cuda/step_chunk.h"

#include <algorithm>

#include "kernels/attention.cuh"

namespace moebatch {
namespace {

int next_pow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Tokens [t0, t1) of the batch as one forward call.
StepChunk prepare(const StepBatch& b, int t0, int t1, const ChunkLimits& lim) {
  StepChunk c;
  const int bs = lim.block_size;
  const int scratch = lim.scratch_block;
  // Attention sequences: runs of consecutive positions of one sequence (query i of a run of
  // n_q tokens sits at kv_len - n_q + i, the attention kernels' contract).
  std::vector<int32_t> run_seq;
  int max_q = 0, max_kv = 0;
  for (int t = t0; t < t1; ++t) {
    const bool cont =
        t > t0 && b.seq_index[t] == b.seq_index[t - 1] && b.positions[t] == b.positions[t - 1] + 1;
    if (!cont) {
      c.q_start.push_back(t - t0);
      c.kv_lens.push_back(0);
      run_seq.push_back(b.seq_index[t]);
    }
    c.kv_lens.back() = b.positions[t] + 1;
    c.tokens.push_back(b.tokens[t]);
    c.positions.push_back(b.positions[t]);
    c.slots.push_back(b.slot_mapping[t]);
  }
  const int n = t1 - t0, seqs = static_cast<int>(run_seq.size());
  c.q_start.push_back(n);
  for (int s = 0; s < seqs; ++s) {
    max_q = std::max(max_q, c.q_start[s + 1] - c.q_start[s]);
    max_kv = std::max(max_kv, c.kv_lens[s]);
  }
  for (size_t i = 0; i < b.logits_rows.size(); ++i) {
    if (b.logits_rows[i] >= t0 && b.logits_rows[i] < t1) {
      c.logits_rows.push_back(b.logits_rows[i] - t0);
      c.out_rows.push_back(static_cast<int32_t>(i));
    }
  }
  bool all_rows = static_cast<int>(c.logits_rows.size()) == n;
  for (int i = 0; all_rows && i < n; ++i) all_rows = c.logits_rows[i] == i;
  StepShape& s = c.shape;
  s.decode = max_q == 1;
  c.decode_graph = s.decode && all_rows && n <= lim.max_num_seqs;
  int width = (max_kv + bs - 1) / bs;
  if (c.decode_graph) {
    // Pad to a bucket so graphs exist for few shapes: padded rows read and write only the
    // scratch block. The kv bound is bucketed too (it sets the split-K ranges).
    int bucket = n <= 32 ? next_pow2(n) : (n + 31) / 32 * 32;
    bucket = std::min(bucket, lim.max_num_seqs);
    const int kv_bucket = std::min(std::max(64, next_pow2(max_kv)), lim.table_cap * bs);
    for (int i = n; i < bucket; ++i) {
      c.tokens.push_back(0);
      c.positions.push_back(0);
      c.slots.push_back(scratch * bs);
      c.q_start.push_back(i + 1);
      c.kv_lens.push_back(1);
      run_seq.push_back(-1);
      c.logits_rows.push_back(i);
    }
    width = (kv_bucket + bs - 1) / bs;
    const int splits = kernels::attention_decode_splits(bucket, lim.num_kv_heads, kv_bucket,
                                                        lim.num_sms, kMaxAttnSplits, lim.min_split_keys);
    s.tokens = s.seqs = bucket;
    s.max_kv_len = kv_bucket;
    s.attn_splits = splits;
    c.key = {bucket, kv_bucket};
  } else {
    s.tokens = n;
    s.seqs = seqs;
    s.max_kv_len = max_kv;
  }
  s.max_q_len = max_q;
  s.table_width = std::max(width, 1);
  if (!b.state_slots.empty()) {
    // a run continues (or, at position 0, starts) its row's state; padding has none
    for (int r = 0; r < s.seqs; ++r)
      c.state_slots.push_back(run_seq[r] < 0 ? -1 : b.state_slots[run_seq[r]]);
  }
  c.tables.assign(static_cast<size_t>(s.seqs) * s.table_width, scratch);
  for (int r = 0; r < s.seqs; ++r) {
    if (run_seq[r] < 0) continue;
    const int32_t* src = b.block_tables.data() + run_seq[r] * b.max_blocks_per_seq;
    const int need = (c.kv_lens[r] + bs - 1) / bs;
    std::copy(src, src + need, c.tables.begin() + static_cast<size_t>(r) * s.table_width);
  }
  return c;
}

}  // namespace

std::vector<StepChunk> prepare_chunks(const StepBatch& b, const ChunkLimits& lim) {
  const int n = static_cast<int>(b.tokens.size());
  std::vector<StepChunk> chunks;
  chunks.reserve(static_cast<size_t>((n + lim.tokens - 1) / lim.tokens));
  for (int t0 = 0; t0 < n; t0 += lim.tokens) {
    chunks.push_back(prepare(b, t0, std::min(n, t0 + lim.tokens), lim));
  }
  return chunks;
}

}  // namespace moebatch
