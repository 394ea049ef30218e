#include "engine/scheduler.h"

#include <algorithm>

#include "common/error.h"

namespace moebatch {

Scheduler::Scheduler(int64_t max_num_seqs, int64_t max_num_batched_tokens, BlockManager& blocks)
    : max_num_seqs_(max_num_seqs),
      max_num_batched_tokens_(max_num_batched_tokens),
      blocks_(blocks) {
  if (max_num_seqs < 1 || max_num_seqs > 4096)
    throw InputError("max_num_seqs must be in [1, 4096]");
  // Every running sequence's decode token must fit in one step.
  if (max_num_batched_tokens < max_num_seqs) {
    throw InputError("max_num_batched_tokens (" + std::to_string(max_num_batched_tokens) +
                     ") must be >= max_num_seqs (" + std::to_string(max_num_seqs) + ")");
  }
  for (auto s = static_cast<int32_t>(max_num_seqs); s-- > 0;) free_slots_.push_back(s);
}

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

ScheduledStep Scheduler::schedule() {
  // admit: FIFO into free slots while the whole budget (prompt + max_tokens) fits in free blocks
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < max_num_seqs_) {
    Sequence& s = *waiting_.front();
    const int64_t budget = s.prompt_len() + s.req.sampling.max_tokens;
    if (!blocks_.can_allocate(budget)) break;
    s.block_table = blocks_.allocate(budget);
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  ScheduledStep step;
  StepBatch& b = step.batch;
  if (running_.empty()) return step;
  int64_t max_blocks = 0;
  for (const auto& s : running_) max_blocks = std::max<int64_t>(max_blocks, s->block_table.size());
  b.max_blocks_per_seq = static_cast<int32_t>(max_blocks);
  // Decode tokens (one pending token) first, then prefill chunks in admission order.
  std::vector<Sequence*> order;
  for (auto& s : running_) {
    if (static_cast<int64_t>(s->tokens.size()) - s->num_computed == 1) order.push_back(s.get());
  }
  for (auto& s : running_) {
    if (static_cast<int64_t>(s->tokens.size()) - s->num_computed > 1) order.push_back(s.get());
  }
  int64_t budget = max_num_batched_tokens_;
  const int64_t bs = blocks_.block_size();
  for (Sequence* s : order) {
    const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->num_computed;
    const int64_t take = std::min(pending, budget);
    if (take <= 0) break;
    const auto row = static_cast<int32_t>(b.block_tables.size() / max_blocks);
    b.block_tables.insert(b.block_tables.end(), s->block_table.begin(), s->block_table.end());
    b.block_tables.resize(b.block_tables.size() + max_blocks - s->block_table.size(), -1);
    b.state_slots.push_back(s->slot);
    for (int64_t i = 0; i < take; ++i) {
      const int64_t pos = s->num_computed + i;
      b.tokens.push_back(s->tokens[pos]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.seq_index.push_back(row);
      b.slot_mapping.push_back(static_cast<int32_t>(s->block_table[pos / bs] * bs + pos % bs));
    }
    s->num_computed += take;
    budget -= take;
    // A chunk that reaches the end of the known tokens yields the next token's logits.
    if (s->num_computed == static_cast<int64_t>(s->tokens.size())) {
      b.logits_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      step.samples_for.push_back(s);
    }
  }
  return step;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::postprocess(const ScheduledStep& step,
                                                              const std::vector<int32_t>& tokens,
                                                              const std::vector<float>* logits,
                                                              int64_t vocab) {
  MB_CHECK(tokens.size() == step.samples_for.size(), "one sampled token per logits row");
  std::vector<std::unique_ptr<Sequence>> done;
  const auto now = SteadyClock::now();
  for (size_t i = 0; i < step.samples_for.size(); ++i) {
    Sequence* s = step.samples_for[i];
    const int32_t tok = tokens[i];
    if (s->generated() == 0) s->t_first_token = now;
    s->tokens.push_back(tok);
    if (s->req.keep_logits) {
      MB_CHECK(logits != nullptr, "a sequence keeps logits but the step returned none");
      const float* row = logits->data() + i * vocab;
      s->logits.insert(s->logits.end(), row, row + vocab);
    }
    const auto& stop_ids = s->req.sampling.stop_token_ids;
    if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
      s->reason = FinishReason::StopToken;
    } else if (s->req.stop_strings && s->req.stop_strings->push(tok)) {
      s->reason = FinishReason::StopString;
    } else if (s->generated() >= s->req.sampling.max_tokens) {
      s->reason = FinishReason::Length;
    } else {
      continue;
    }
    done.push_back(finish(s));
  }
  return done;
}

bool Scheduler::abort(uint64_t id) {
  auto w = std::find_if(waiting_.begin(), waiting_.end(),
                        [&](const auto& p) { return p->req.id == id; });
  if (w != waiting_.end()) {
    waiting_.erase(w);
    return true;
  }
  auto r = std::find_if(running_.begin(), running_.end(),
                        [&](const auto& p) { return p->req.id == id; });
  if (r == running_.end()) return false;
  finish(r->get());
  return true;
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* seq) {
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
  MB_CHECK(it != running_.end(), "finishing a sequence that is not running");
  std::unique_ptr<Sequence> out = std::move(*it);
  running_.erase(it);
  blocks_.release(out->block_table);
  free_slots_.push_back(out->slot);
  return out;
}

}  // namespace moebatch
