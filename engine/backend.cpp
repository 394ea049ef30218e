#include "engine/backend.h"

#include "common/error.h"
#include "engine/sampler.h"

namespace moebatch {

int64_t BackendInfo::weight_bytes() const {
  int64_t n = 0;
  for (const DeviceUsage& d : devices) n += d.weight_bytes;
  return n;
}

std::vector<int32_t> StateSlotTracker::advance(const StepBatch& b) {
  MB_CHECK(b.max_blocks_per_seq > 0, "a step with state needs block tables");
  const size_t num_rows = b.block_tables.size() / static_cast<size_t>(b.max_blocks_per_seq);
  MB_CHECK(b.state_slots.size() == num_rows,
           "a linear-attention model needs one state slot per row");
  std::vector<int64_t> first(num_rows, -1), next(num_rows, -1);
  for (size_t t = 0; t < b.tokens.size(); ++t) {
    const auto row = static_cast<size_t>(b.seq_index[t]);
    if (first[row] < 0) {
      first[row] = next[row] = b.positions[t];
    } else {
      MB_CHECK(b.seq_index[t - 1] == b.seq_index[t], "a row's tokens must be adjacent in the batch");
    }
    MB_CHECK(b.positions[t] == next[row], "a row's tokens must be consecutive positions");
    ++next[row];
  }
  std::vector<char> used(next_pos_.size(), 0);
  for (size_t row = 0; row < num_rows; ++row) {
    if (first[row] < 0) continue;  // a row without tokens leaves its slot alone
    const int32_t s = b.state_slots[row];
    MB_CHECK(s >= 0 && static_cast<size_t>(s) < next_pos_.size(), "state slot out of range");
    MB_CHECK(!used[s], "two rows of one step share a state slot");
    used[s] = 1;
    MB_CHECK(first[row] == 0 || first[row] == next_pos_[s],
             "a row must start at position 0 or where its state slot ended");
  }
  // checked: record where every row's slot ends
  std::vector<int32_t> started;
  for (size_t row = 0; row < num_rows; ++row) {
    if (first[row] < 0) continue;
    const int32_t s = b.state_slots[row];
    if (first[row] == 0) started.push_back(s);
    next_pos_[s] = next[row];
  }
  return started;
}

void validate_step_batch(const StepBatch& b, const ModelConfig& cfg, int64_t num_blocks,
                         int64_t block_size, int64_t max_model_len) {
  const size_t n = b.tokens.size();
  MB_CHECK(n > 0, "empty batch");
  MB_CHECK(b.positions.size() == n && b.seq_index.size() == n && b.slot_mapping.size() == n,
           "batch arrays must have one entry per token");
  MB_CHECK(b.max_blocks_per_seq > 0 && b.block_tables.size() % b.max_blocks_per_seq == 0,
           "block_tables must be [num_seqs, max_blocks_per_seq]");
  const int64_t num_seqs = static_cast<int64_t>(b.block_tables.size()) / b.max_blocks_per_seq;
  for (int32_t blk : b.block_tables)
    MB_CHECK(blk >= -1 && blk < num_blocks, "block id out of range");
  for (size_t i = 0; i < n; ++i) {
    MB_CHECK(b.tokens[i] >= 0 && b.tokens[i] < cfg.vocab_size, "token id out of vocab");
    MB_CHECK(b.seq_index[i] >= 0 && b.seq_index[i] < num_seqs, "seq_index out of range");
    MB_CHECK(b.positions[i] >= 0 && b.positions[i] < b.max_blocks_per_seq * block_size &&
                 b.positions[i] < max_model_len,
             "position beyond the block table or max_model_len");
    MB_CHECK(b.slot_mapping[i] >= 0 && b.slot_mapping[i] < num_blocks * block_size,
             "slot out of range");
    const int32_t* table = b.block_tables.data() + b.seq_index[i] * b.max_blocks_per_seq;
    for (int32_t p = 0; p <= b.positions[i] / block_size; ++p) {
      MB_CHECK(table[p] >= 0, "block table does not cover the token's positions");
    }
  }
  for (int32_t r : b.logits_rows)
    MB_CHECK(r >= 0 && static_cast<size_t>(r) < n, "logits row out of range");
  MB_CHECK(b.state_slots.empty() || static_cast<int64_t>(b.state_slots.size()) == num_seqs,
           "state_slots must have one entry per block_tables row");
}

void sample_rows_host(const std::vector<float>& logits, int64_t vocab,
                      const std::vector<RowSampling>& rows, std::vector<int32_t>& tokens) {
  MB_CHECK(logits.size() == rows.size() * static_cast<size_t>(vocab), "one logits row per sample");
  tokens.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    GenerationParams p;
    p.temperature = rows[i].temperature > 0.0f ? rows[i].temperature : 0.0f;
    p.top_k = rows[i].top_k > 0 ? rows[i].top_k : 0;
    p.top_p = rows[i].top_p;
    p.seed = rows[i].seed;
    tokens[i] = sample_token(logits.data() + i * vocab, vocab, p, rows[i].step);
  }
}

void Backend::forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                             std::vector<int32_t>& tokens, std::vector<float>* logits) {
  std::vector<float> local;
  std::vector<float>& out = logits ? *logits : local;
  forward(batch, out);
  sample_rows_host(out, config().vocab_size, rows, tokens);
}

}  // namespace moebatch
