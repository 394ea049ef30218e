// Queue side of the service: includes the queue's headers and none of the engine's.
#include "service/job_codec.h"

#include <cmath>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/tokenizer/streaming.h"
#include "engine/tokenizer/text_stop.h"
#include "engine/tokenizer/tokenizer.h"
#include "service/openai_api.h"

namespace moebatch {
namespace {

// Chat prompts were validated by the store (JSON array of {role, content[, name]} objects);
// this only maps them onto the template's message type.
std::vector<ChatMessage> parse_chat(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_array()) throw InputError("prompt: not a JSON array of messages");
  std::vector<ChatMessage> out;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string()) {
      throw InputError("prompt: every message needs string role and content");
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt});
  }
  return out;
}

// "Engine picks" a seed for jobs without one: derived from the job id, so a rerun of the same
// job after a crash samples the same text.
uint64_t default_seed(int64_t job_id) {
  uint64_t x = static_cast<uint64_t>(job_id) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Engine timings are small and finite; the clamp keeps a corrupt one from being undefined.
int64_t ms_of(double s) {
  const double ms = std::round(s * 1000.0);
  if (!(ms > 0)) return 0;
  if (ms >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(ms);
}

// Saturating arithmetic for times that come from the row: enqueued_at is producer-writable (a
// plain-SQL INSERT may put INT64_MIN there), so a difference or sum must not overflow.
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

int64_t sat_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

// Generated ids decoded one by one, leniently (unknown ids become U+FFFD), exactly as the
// engine's stop-string watcher decodes them.
std::string decode_tokens(const std::vector<int32_t>& ids, const Tokenizer& tokenizer) {
  IncrementalDecoder dec(tokenizer, /*skip_special=*/true);
  std::string text;
  for (int32_t id : ids) text += dec.push_lenient(id);
  return text + dec.finish();
}

std::variant<WorkItem, std::string> prepare_work_unchecked(const Job& job,
                                                           const Tokenizer& tokenizer,
                                                           const IntakeLimits& limits) {
  const SamplingParams& sp = job.spec.sampling;
  WorkItem w;
  w.job_id = job.id;
  std::vector<TokenId> ids;
  ChatOptions chat_options;
  if (job.spec.chat_template_kwargs) {
    const auto kw = nlohmann::json::parse(*job.spec.chat_template_kwargs, nullptr, false);
    auto opts = chat_options_from_kwargs(kw);
    if (auto* reason = std::get_if<std::string>(&opts)) return *reason;
    chat_options = std::get<ChatOptions>(opts);
  }
  try {
    if (job.spec.prompt_kind == PromptKind::Chat) {
      ids = tokenizer.encode_chat(parse_chat(job.spec.prompt), chat_options);
    } else {
      // Plain prompts are user text: special-token spellings inside are tokenized as text.
      ids = tokenizer.encode(job.spec.prompt, /*parse_special=*/false);
    }
  } catch (const InputError& e) {
    return std::string("prompt: ") + e.what();
  } catch (const std::exception& e) {
    // Not the producer's fault in the usual sense (e.g. the pre-tokenizer regex hit PCRE2's
    // match limit), but only this prompt is affected: it fails alone, for good.
    return std::string("prompt: cannot be tokenized: ") + e.what();
  }
  const auto n = static_cast<int64_t>(ids.size());
  if (n == 0) return std::string("prompt: renders to no tokens");
  if (n > limits.max_prompt_tokens) {
    return "prompt: " + std::to_string(n) + " tokens exceeds the limit of " +
           std::to_string(limits.max_prompt_tokens);
  }
  if (sp.max_tokens < 1) return std::string("max_tokens: must be >= 1");
  if (n + sp.max_tokens > limits.max_model_len) {
    return "max_tokens: prompt (" + std::to_string(n) + " tokens) + max_tokens (" +
           std::to_string(sp.max_tokens) + ") exceeds the context limit of " +
           std::to_string(limits.max_model_len);
  }
  for (TokenId id : ids) {
    if (static_cast<int64_t>(id) >= limits.vocab_size) {
      return "prompt: token id " + std::to_string(id) + " is outside the model's vocabulary of " +
             std::to_string(limits.vocab_size);
    }
    w.prompt.push_back(static_cast<int32_t>(id));
  }
  w.max_tokens = sp.max_tokens;
  w.temperature = static_cast<float>(sp.temperature);
  w.top_p = static_cast<float>(sp.top_p);
  w.top_k = sp.top_k;
  w.seed = sp.seed ? static_cast<uint64_t>(*sp.seed) : default_seed(job.id);
  for (TokenId id : tokenizer.eos_ids()) {
    if (static_cast<int64_t>(id) < limits.vocab_size)
      w.stop_ids.push_back(static_cast<int32_t>(id));
  }
  if (!sp.stop.empty()) {
    try {
      w.stop_strings = std::make_shared<TextStopStrings>(tokenizer, sp.stop);
    } catch (const std::exception& e) {
      return std::string("stop: ") + e.what();
    }
  }
  w.priority = job.spec.priority;
  w.claimed = std::chrono::steady_clock::now();
  return w;
}

}  // namespace

std::variant<WorkItem, std::string> prepare_work(const Job& job, const Tokenizer& tokenizer,
                                                 const IntakeLimits& limits) {
  // The dispatcher prepares a whole claim group in one loop: an exception escaping here would
  // abandon the group's other jobs, leased but never run. Whatever one job's input provokes
  // becomes that job's reason.
  try {
    return prepare_work_unchecked(job, tokenizer, limits);
  } catch (const std::exception& e) {
    return std::string("job: cannot be prepared: ") + e.what();
  }
}

Completion make_completion(const WorkResult& r, const InFlightJob& job,
                           const Tokenizer& tokenizer) {
  Completion c;
  c.id = r.job_id;
  // The stop token ends the sequence but is not part of the answer's text.
  std::vector<int32_t> text_ids = r.tokens;
  if (r.hit_stop_token && !text_ids.empty()) text_ids.pop_back();
  std::string text = decode_tokens(text_ids, tokenizer);
  bool stopped_by_string = false;
  if (!job.stop.empty()) {
    StopMatcher matcher(job.stop);
    StopMatcher::Step st = matcher.push(text);
    if (st.stopped) {
      text = std::move(st.text);
      stopped_by_string = true;
    } else {
      text = st.text + matcher.finish();
    }
  }
  c.result.text = std::move(text);
  c.result.prompt_tokens = r.prompt_tokens;
  c.result.completion_tokens = static_cast<int64_t>(r.tokens.size());
  c.result.finish_reason =
      (r.hit_stop_token || r.hit_stop_string || stopped_by_string) ? "stop" : "length";

  // Latency: queue wait on the store's clock; engine phases measured on the steady clock from
  // the moment of the claim, so total = wait + hand-off + engine time.
  const int64_t wait_ms = std::max<int64_t>(0, sat_sub(job.started_at, job.enqueued_at));
  const double decode_s = std::max(0.0, r.total_s - r.ttft_s);
  c.latency.queue_wait_ms = wait_ms;
  c.latency.ttft_ms = ms_of(r.handoff_s + r.ttft_s);
  c.latency.decode_ms = ms_of(decode_s);
  c.latency.total_ms = sat_add(wait_ms, ms_of(r.handoff_s + r.total_s));
  // Decode throughput: tokens after the first over the time after the first.
  if (r.tokens.size() > 1 && decode_s > 0)
    c.latency.tokens_per_s = static_cast<double>(r.tokens.size() - 1) / decode_s;
  c.result.first_token_at = sat_add(job.started_at, *c.latency.ttft_ms);
  return c;
}

}  // namespace moebatch
