#include "queue/job_json.h"

#include "common/error.h"
#include "common/json_parse.h"

namespace moebatch {
namespace {

using nlohmann::json;

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// Stored JSON text (a chat prompt, metadata, chat_template_kwargs) as a value, parsed with the
// depth bound: a row written with plain SQL may hold anything, and a document nested 200,000
// deep parses fine but overflows the stack when printed. What does not parse comes back as the
// raw string.
json stored_json_or_text(const std::string& text) {
  json parsed = parse_json_bounded(text);
  if (parsed.is_discarded()) return json(text);
  return parsed;
}

json percentiles_to_json(const Percentiles& p) {
  return {{"count", p.count}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}};
}

}  // namespace

json job_to_json(const Job& job) {
  const JobSpec& s = job.spec;
  // Chat prompts are stored as JSON; a row that is not (or nests too deep) shows the raw text.
  json prompt = s.prompt_kind == PromptKind::Chat ? stored_json_or_text(s.prompt) : json(s.prompt);
  json j = {
      {"id", job.id},
      {"state", job_state_to_string(job.state)},
      {"client_key", opt(s.client_key)},
      {"batch_id", opt(s.batch_id)},
      {"custom_id", opt(s.custom_id)},
      {"model", opt(s.model)},
      {"user", opt(s.user)},
      {"metadata", s.metadata ? stored_json_or_text(*s.metadata) : json(nullptr)},
      {"priority", s.priority},
      {"prompt_kind", prompt_kind_to_string(s.prompt_kind)},
      {"prompt", prompt},
      {"chat_template_kwargs",
       s.chat_template_kwargs ? stored_json_or_text(*s.chat_template_kwargs) : json(nullptr)},
      {"sampling",
       {{"max_tokens", s.sampling.max_tokens},
        {"temperature", s.sampling.temperature},
        {"top_p", s.sampling.top_p},
        {"top_k", s.sampling.top_k},
        {"seed", opt(s.sampling.seed)},
        {"stop", s.sampling.stop}}},
      {"attempts", job.attempts},
      {"max_attempts", s.max_attempts},
      {"lease_owner", opt(job.lease_owner)},
      {"lease_expires_at", opt(job.lease_expires_at)},
      {"error", opt(job.error)},
      {"enqueued_at", job.enqueued_at},
      {"not_before", job.not_before},
      {"started_at", opt(job.started_at)},
      {"first_token_at", opt(job.first_token_at)},
      {"finished_at", opt(job.finished_at)},
      {"result", nullptr},
  };
  if (job.result) {
    j["result"] = {{"text", job.result->text},
                   {"prompt_tokens", job.result->prompt_tokens},
                   {"completion_tokens", job.result->completion_tokens},
                   {"finish_reason", job.result->finish_reason}};
  }
  return j;
}

json latency_to_json(const LatencyRecord& l) {
  return {{"queue_wait_ms", l.queue_wait_ms},
          {"ttft_ms", opt(l.ttft_ms)},
          {"decode_ms", opt(l.decode_ms)},
          {"total_ms", l.total_ms},
          {"tokens_per_s", opt(l.tokens_per_s)}};
}

json stats_to_json(const QueueStats& stats) {
  json counts = json::object();
  for (const auto& [state, n] : stats.counts) counts[std::string(job_state_to_string(state))] = n;
  return {{"counts", counts},
          {"latency_window", stats.latency_window},
          {"latency",
           {{"queue_wait_ms", percentiles_to_json(stats.queue_wait_ms)},
            {"ttft_ms", percentiles_to_json(stats.ttft_ms)},
            {"total_ms", percentiles_to_json(stats.total_ms)},
            {"tokens_per_s", percentiles_to_json(stats.tokens_per_s)}}}};
}

json batch_counts_to_json(const std::string& batch_id, const BatchCounts& c) {
  json counts = json::object();
  for (const auto& [state, n] : c.counts) counts[std::string(job_state_to_string(state))] = n;
  auto opt_i = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  return {{"batch_id", batch_id},
          {"total", c.total},
          {"counts", counts},
          {"prompt_tokens", c.prompt_tokens},
          {"completion_tokens", c.completion_tokens},
          {"first_enqueued_at", opt_i(c.first_enqueued_at)},
          {"last_finished_at", opt_i(c.last_finished_at)}};
}

BatchCounts batch_counts_from_json(const json& j) {
  auto integer = [&](const char* k) {
    if (!j.is_object() || !j.contains(k) || !j[k].is_number_integer()) {
      throw Error(std::string("malformed batch reply: ") + k);
    }
    return j[k].get<int64_t>();
  };
  auto opt_integer = [&](const char* k) -> std::optional<int64_t> {
    if (j.contains(k) && j[k].is_null()) return std::nullopt;
    return integer(k);
  };
  BatchCounts c;
  c.total = integer("total");
  c.prompt_tokens = integer("prompt_tokens");
  c.completion_tokens = integer("completion_tokens");
  c.first_enqueued_at = opt_integer("first_enqueued_at");
  c.last_finished_at = opt_integer("last_finished_at");
  const json& counts = j.value("counts", json());
  for (JobState s : {JobState::Queued, JobState::Running, JobState::Done, JobState::Failed,
                     JobState::Cancelled}) {
    const std::string name(job_state_to_string(s));
    if (!counts.is_object() || !counts.contains(name) || !counts[name].is_number_integer()) {
      throw Error("malformed batch reply: counts." + name);
    }
    c.counts[s] = counts[name].get<int64_t>();
  }
  return c;
}

}  // namespace moebatch
