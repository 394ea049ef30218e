#include "engine/engine.h"

#include <algorithm>

#include "common/error.h"

namespace moebatch {
namespace {

double seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

void validate_tokens(const std::vector<int32_t>& tokens, int64_t vocab) {
  if (tokens.empty()) throw InputError("request: prompt is empty");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw InputError("request: prompt token " + std::to_string(i) + " = " +
                       std::to_string(tokens[i]) + " outside vocab of " + std::to_string(vocab));
    }
  }
}

}  // namespace

Engine::Engine(std::unique_ptr<Backend> backend, const EngineOptions& opts)
    : backend_(std::move(backend)),
      blocks_(backend_->info().kv_blocks, backend_->info().block_size),
      scheduler_(opts.max_num_seqs, opts.max_num_batched_tokens, blocks_) {
  // A slot index is also the sequence's recurrent-state slot (StepBatch::state_slots).
  const int64_t state_slots = backend_->info().state_slots;
  if (state_slots > 0 && opts.max_num_seqs > state_slots) {
    throw InputError("max_num_seqs = " + std::to_string(opts.max_num_seqs) +
                     " exceeds the backend's " + std::to_string(state_slots) +
                     " recurrent-state slots");
  }
}

void Engine::add(Request req) {
  const ModelConfig& cfg = backend_->config();
  validate_tokens(req.prompt, cfg.vocab_size);
  validate_sampling(req.sampling, cfg.vocab_size);
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.sampling.max_tokens;
  const int64_t max_len = std::min(cfg.max_position_embeddings, backend_->info().max_model_len);
  if (total > max_len) {
    throw InputError("request: prompt + max_tokens = " + std::to_string(total) +
                     " exceeds the model length of " + std::to_string(max_len) + " tokens");
  }
  if (blocks_.blocks_for(total) > blocks_.num_blocks()) {
    throw InputError("request: prompt + max_tokens = " + std::to_string(total) +
                     " tokens exceeds the KV cache of " +
                     std::to_string(blocks_.num_blocks() * blocks_.block_size()) + " tokens");
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = req.prompt;
  seq->t_added = SteadyClock::now();
  seq->req = std::move(req);
  scheduler_.add(std::move(seq));
}

std::vector<FinishedSequence> Engine::step() {
  ScheduledStep st = scheduler_.schedule();
  if (st.batch.tokens.empty()) return {};
  // run: one token per logits row, sampled where the backend samples (logits come back only
  // when a request keeps them)
  rows_.clear();
  bool keep_logits = false;
  for (const Sequence* s : st.samples_for) {
    const GenerationParams& p = s->req.sampling;
    rows_.push_back({p.temperature, static_cast<int32_t>(std::min<int64_t>(p.top_k, 1 << 30)),
                     p.top_p, p.seed, static_cast<uint64_t>(s->generated())});
    keep_logits = keep_logits || s->req.keep_logits;
  }
  backend_->forward_sample(st.batch, rows_, sampled_, keep_logits ? &logits_ : nullptr);
  // postprocess: append, check stops, finish
  std::vector<FinishedSequence> done;
  for (auto& fin : scheduler_.postprocess(st, sampled_, keep_logits ? &logits_ : nullptr,
                                          config().vocab_size)) {
    FinishedSequence f;
    f.id = fin->req.id;
    f.tokens.assign(fin->tokens.begin() + fin->prompt_len(), fin->tokens.end());
    f.reason = fin->reason;
    f.prompt_tokens = fin->prompt_len();
    f.time_to_first_token_s = seconds(fin->t_first_token - fin->t_added);
    f.total_s = seconds(SteadyClock::now() - fin->t_added);
    f.logits = std::move(fin->logits);
    done.push_back(std::move(f));
  }
  return done;
}

std::vector<float> Engine::score(const std::vector<int32_t>& tokens) {
  MB_CHECK(idle(), "score() needs an idle engine");
  const ModelConfig& cfg = backend_->config();
  validate_tokens(tokens, cfg.vocab_size);
  const auto T = static_cast<int64_t>(tokens.size());
  if (T > std::min(cfg.max_position_embeddings, backend_->info().max_model_len) ||
      blocks_.blocks_for(T) > blocks_.num_blocks()) {
    throw InputError("score: " + std::to_string(T) + " tokens exceed the model or KV cache length");
  }
  std::vector<int32_t> table = blocks_.allocate(T);
  StepBatch b;
  b.tokens = tokens;
  b.block_tables = table;
  b.max_blocks_per_seq = static_cast<int32_t>(table.size());
  b.state_slots = {0};  // the engine is idle: every slot is free
  const int64_t bs = blocks_.block_size();
  for (int64_t p = 0; p < T; ++p) {
    b.positions.push_back(static_cast<int32_t>(p));
    b.seq_index.push_back(0);
    b.slot_mapping.push_back(static_cast<int32_t>(table[p / bs] * bs + p % bs));
    b.logits_rows.push_back(static_cast<int32_t>(p));
  }
  std::vector<float> out;
  try {
    backend_->forward(b, out);
  } catch (...) {
    blocks_.release(table);
    throw;
  }
  blocks_.release(table);
  return out;
}

std::vector<FinishedSequence> run_to_completion(Engine& engine) {
  std::vector<FinishedSequence> all;
  while (!engine.idle()) {
    for (auto& f : engine.step()) all.push_back(std::move(f));
  }
  return all;
}

}  // namespace moebatch
