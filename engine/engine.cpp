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
      blocks_(backend_->num_kv_blocks(), backend_->block_size()),
      scheduler_(opts.max_num_seqs, opts.max_num_batched_tokens, blocks_) {}

void Engine::add(Request req) {
  const ModelConfig& cfg = backend_->config();
  validate_tokens(req.prompt, cfg.vocab_size);
  validate_sampling(req.sampling, cfg.vocab_size);
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.sampling.max_tokens;
  if (total > cfg.max_position_embeddings) {
    throw InputError("request: prompt + max_tokens = " + std::to_string(total) +
                     " exceeds max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  }
  if (blocks_.blocks_for(total) > blocks_.num_blocks()) {
    throw InputError("request: prompt + max_tokens = " + std::to_string(total) +
                     " tokens exceeds the KV cache of " +
                     std::to_string(blocks_.num_blocks() * blocks_.block_size()) + " tokens");
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = req.prompt;
  seq->rng.seed(req.sampling.seed);
  seq->t_added = SteadyClock::now();
  seq->req = std::move(req);
  scheduler_.add(std::move(seq));
}

std::vector<FinishedSequence> Engine::step() {
  std::vector<FinishedSequence> done;
  ScheduledStep st = scheduler_.schedule();
  if (st.batch.tokens.empty()) return done;
  const int64_t vocab = backend_->config().vocab_size;
  // Device sampling returns tokens only; a request that keeps its logits needs them on the host.
  const bool on_device =
      backend_->samples_on_device() &&
      std::none_of(st.samples_for.begin(), st.samples_for.end(),
                   [](const Sequence* s) { return s->req.keep_logits; });
  std::vector<int32_t> sampled(st.samples_for.size());
  if (on_device) {
    std::vector<RowSampling> rows;
    for (const Sequence* s : st.samples_for) {
      const GenerationParams& sp = s->req.sampling;
      rows.push_back({sp.temperature, static_cast<int32_t>(std::min<int64_t>(sp.top_k, 1 << 30)), sp.top_p, sp.seed,
                      static_cast<uint64_t>(s->generated())});
    }
    backend_->forward_sample(st.batch, rows, sampled);
    MB_CHECK(sampled.size() == st.samples_for.size(), "backend returned one token per row");
  } else {
    backend_->forward(st.batch, logits_);
  }
  const auto now = SteadyClock::now();
  for (size_t i = 0; i < st.samples_for.size(); ++i) {
    Sequence* s = st.samples_for[i];
    const float* row = on_device ? nullptr : logits_.data() + i * vocab;
    const int32_t tok = on_device ? sampled[i] : sample_token(row, vocab, s->req.sampling, s->rng);
    if (s->generated() == 0) s->t_first_token = now;
    s->tokens.push_back(tok);
    if (s->req.keep_logits) s->logits.insert(s->logits.end(), row, row + vocab);
    const auto& stops = s->req.sampling.stop_token_ids;
    const bool stop = std::find(stops.begin(), stops.end(), tok) != stops.end();
    if (!stop && s->generated() < s->req.sampling.max_tokens) continue;
    auto fin = scheduler_.finish(s);
    FinishedSequence f;
    f.id = fin->req.id;
    f.tokens.assign(fin->tokens.begin() + fin->prompt_len(), fin->tokens.end());
    f.reason = stop ? FinishReason::Stop : FinishReason::Length;
    f.prompt_tokens = fin->prompt_len();
    f.time_to_first_token_s = seconds(fin->t_first_token - fin->t_added);
    f.total_s = seconds(now - fin->t_added);
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
  if (T > cfg.max_position_embeddings || blocks_.blocks_for(T) > blocks_.num_blocks()) {
    throw InputError("score: " + std::to_string(T) + " tokens exceed the model or KV cache length");
  }
  std::vector<int32_t> table = blocks_.allocate(T);
  StepBatch b;
  b.tokens = tokens;
  b.block_tables = table;
  b.max_blocks_per_seq = static_cast<int32_t>(table.size());
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
