// The OpenAI-compatible API (docs/openai_api.md): GET /v1/models, POST /v1/chat/completions
// and /v1/completions. Each request becomes a high-priority job in the same durable queue as
// batch work; the reply waits for the job's result, or streams its text as the engine thread
// reports the tokens of each step. A client that goes away cancels its job. Everything here
// runs on the io thread, beside the dispatcher, so it uses the store and the tokenizer directly.
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "queue/job_store.h"
#include "service/api_call.h"
#include "service/engine_worker.h"
#include "service/service.h"

namespace moebatch {
namespace {

// Calls whose job runs elsewhere (queued, or taken over by another daemon) are answered from
// the final-event log as their jobs end (publish_finals). This look-up of each such call's job
// is the safety net, for a job deleted from the table or events pruned before they were read.
constexpr int64_t kResolveEveryMs = 5000;

HttpReply error_reply(const ApiError& e, HttpHeaders headers = {}) {
  return {e.status, "application/json", render_error(e) + "\n", std::move(headers)};
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// GET /v1/models, and GET /v1/models/{id} for the one model served.
void Service::api_models(const std::shared_ptr<HttpExchange>& ex) {
  const auto& params = ex->request().params;
  if (params.empty()) {
    ex->reply({200, "application/json",
               render_models(served_model_, unix_seconds(), limits_.max_model_len) + "\n"});
  } else if (params[0] == served_model_) {
    ex->reply({200, "application/json",
               render_model(served_model_, unix_seconds(), limits_.max_model_len) + "\n"});
  } else {
    ex->reply(error_reply({404, "The model `" + params[0] + "` does not exist.", "model",
                           "model_not_found", "invalid_request_error"}));
  }
}

// While the store refuses writes, a request that needs one is answered 503 at once rather than
// waiting on the lock (or the full disk) with everything else on this thread.
bool Service::store_refuses(const std::shared_ptr<HttpExchange>& ex) {
  if (!store_health_.unwritable(steady_now_ms())) return false;
  ex->reply(error_reply({503, "the job queue is not taking writes right now; retry later", "",
                         "queue_unavailable", "server_error"},
                        {{"Retry-After", "5"}}));
  return true;
}

void Service::api_generate(ApiKind kind, const std::shared_ptr<HttpExchange>& ex) {
  // Admission: the daemon must be able to run the job soon, and the open requests are bounded.
  if (done_ || stopping_ || worker_engine_->dead()) {
    ex->reply(error_reply({503, "the server is shutting down", "", "shutting_down", "server_error"},
                          {{"Retry-After", "5"}}));
    return;
  }
  if (maintenance_) {
    ex->reply(
        error_reply({503, "the engine is restarting (maintenance cycle); retry shortly", "",
                     "engine_restarting", "server_error"},
                    {{"Retry-After", std::to_string(std::max<int64_t>(1, cfg_.drain_timeout_s))}}));
    return;
  }
  if (store_refuses(ex)) return;
  if (static_cast<int64_t>(api_calls_.size()) >= cfg_.api_max_pending) {
    ex->reply(error_reply(
        {429,
         "too many requests in progress (" + std::to_string(api_calls_.size()) + "); retry later",
         "", "queue_full", "rate_limit_error"},
        {{"Retry-After", "1"}}));
    return;
  }
  auto parsed =
      parse_api_request(kind, ex->request().body, served_model_, store_->options().limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    ex->reply(error_reply(*e));
    return;
  }
  ApiRequest& req = std::get<ApiRequest>(parsed);
  const char* input = kind == ApiKind::Chat ? "messages" : "prompt";

  // Count the prompt now, so a request that cannot fit is refused with 400 instead of queued to
  // fail, and an unset max_tokens can take what the context leaves (as vLLM does).
  int64_t n = 0;
  try {
    n = static_cast<int64_t>(
        kind == ApiKind::Chat
            ? tokenizer_->encode_chat(req.messages, req.chat_options).size()
            : tokenizer_->encode(req.spec.prompt, /*parse_special=*/false).size());
  } catch (const InputError& e) {
    ex->reply(error_reply(invalid_request(std::string(input) + ": " + e.what(), input)));
    return;
  }
  const int64_t ctx = limits_.max_model_len;
  if (n == 0 || n > limits_.max_prompt_tokens || n >= ctx ||
      (req.max_tokens_given && n + req.spec.sampling.max_tokens > ctx)) {
    std::string msg = "This model's maximum context length is " + std::to_string(ctx) +
                      " tokens (prompts at most " + std::to_string(limits_.max_prompt_tokens) +
                      "). However, you requested " + std::to_string(n) + " prompt tokens";
    if (req.max_tokens_given)
      msg += " and " + std::to_string(req.spec.sampling.max_tokens) + " completion tokens";
    ex->reply(error_reply(invalid_request(msg + ".", input, "context_length_exceeded")));
    return;
  }
  if (!req.max_tokens_given) {
    req.spec.sampling.max_tokens = std::min<int64_t>(store_->options().limits.max_tokens, ctx - n);
  }
  req.spec.priority = cfg_.api_priority;
  req.spec.batch_id = "openai-api";

  SubmitResult sub;
  try {
    sub = store_->submit(req.spec);
  } catch (const InputError& e) {
    ex->reply(error_reply(invalid_request(e.what())));
    return;
  } catch (const std::exception& e) {
    store_failed("queueing an API request", e.what());
    ex->reply(error_reply(
        {503, "the job queue is unavailable; retry later", "", "queue_unavailable", "server_error"},
        {{"Retry-After", "1"}}));
    return;
  }
  const int64_t id = sub.id;
  auto call = std::make_unique<ApiCall>();
  call->ex = ex;
  call->rid = {kind, (kind == ApiKind::Chat ? "chatcmpl-" : "cmpl-") + std::to_string(id),
               unix_seconds(), served_model_};
  call->stream = req.stream;
  call->include_usage = req.include_usage;
  call->prompt_tokens = n;
  call->stop = req.spec.sampling.stop;
  if (call->stream) {
    call->deltas.emplace(*tokenizer_, call->stop);
    ex->begin_stream(200, "text/event-stream", {{"X-Accel-Buffering", "no"}});
    // The role arrives first, as OpenAI sends it, so a client sees the stream open at once.
    if (kind == ApiKind::Chat)
      ex->write(render_chunk(call->rid, "", /*first=*/true, std::nullopt, call->include_usage));
  }
  ex->on_disconnect([this, id] { api_client_gone(id); });
  api_calls_[id] = std::move(call);
  // Our own commit does not move data_version: claim now, the job may take a free slot at once.
  claim_now_ = true;
  try {
    claim();
  } catch (const std::exception& e) {
    spdlog::error("intake: {} (retrying at the next poll)", e.what());
  }
}

bool Service::api_streaming(int64_t job_id) const {
  auto it = api_calls_.find(job_id);
  return it != api_calls_.end() && it->second->stream;
}

// Tokens of the last steps → text deltas on the streams that asked for them.
void Service::api_progress(std::vector<WorkProgress>& progress) {
  for (WorkProgress& p : progress) {
    auto f = in_flight_.find(p.job_id);
    if (f == in_flight_.end() || f->second.ticket != p.ticket) continue;  // a claim given up
    auto it = api_calls_.find(p.job_id);
    if (it == api_calls_.end() || !it->second->deltas) continue;
    ApiCall& c = *it->second;
    const std::string d = c.deltas->push(p.tokens);
    if (d.empty()) continue;
    c.sent += d;
    c.ex->write(render_chunk(c.rid, d, /*first=*/false, std::nullopt, c.include_usage));
  }
}

void Service::api_finished(const Completion& c) {
  auto it = api_calls_.find(c.id);
  if (it == api_calls_.end()) return;
  std::unique_ptr<ApiCall> call = std::move(it->second);
  api_calls_.erase(it);
  const ApiResult r{c.result.text, c.result.finish_reason, c.result.prompt_tokens,
                    c.result.completion_tokens};
  if (!call->stream) {
    call->ex->reply({200, "application/json", render_response(call->rid, r) + "\n"});
    return;
  }
  // The deltas sent so far are a prefix of the stored text by construction (same decoding,
  // same stop matching); the tail is what the decoder and the stop matcher still held back.
  std::string tail;
  if (r.text.compare(0, call->sent.size(), call->sent) == 0) {
    tail = r.text.substr(call->sent.size());
  } else {
    spdlog::warn("api: job {}: streamed text is not a prefix of the stored text", c.id);
  }
  call->ex->write(
      render_chunk(call->rid, tail, /*first=*/false, r.finish_reason, call->include_usage));
  if (call->include_usage)
    call->ex->write(render_usage_chunk(call->rid, r.prompt_tokens, r.completion_tokens));
  call->ex->write(sse_done());
  call->ex->end_stream();
}

void Service::api_failed(int64_t job_id, const ApiError& e) {
  auto it = api_calls_.find(job_id);
  if (it == api_calls_.end()) return;
  std::unique_ptr<ApiCall> call = std::move(it->second);
  api_calls_.erase(it);
  if (call->ex->streaming()) {
    call->ex->write(render_stream_error(e));
    call->ex->end_stream();
  } else {
    call->ex->reply(error_reply(e));
  }
}

// A run of an API job starts over: it was claimed (again, after its lease was lost), or its run
// was given back unfinished (maintenance drain deadline) to run again later. A stream that has
// sent no text yet restarts its decoder; one that has cannot take the text back, so its job is
// cancelled and the stream ends with `e`: false then, and the job must not run.
bool Service::api_run_starts(int64_t job_id, const ApiError& e) {
  auto it = api_calls_.find(job_id);
  if (it == api_calls_.end() || !it->second->stream) return true;
  ApiCall& c = *it->second;
  if (c.sent.empty()) {
    c.deltas.emplace(*tokenizer_, c.stop);
    return true;
  }
  try {
    store_->cancel(job_id);
  } catch (const std::exception& ex) {
    spdlog::error("api: cancelling job {}: {}", job_id, ex.what());
  }
  api_failed(job_id, e);
  return false;
}

// The client went away: cancel its job (durably), and stop the engine's work on it now, since
// our own commit does not reach stop_lost_jobs through data_version.
void Service::api_client_gone(int64_t job_id) {
  if (api_calls_.erase(job_id) == 0) return;
  try {
    if (store_->cancel(job_id)) spdlog::info("api: job {} cancelled: client disconnected", job_id);
  } catch (const std::exception& e) {
    spdlog::error("api: cancelling job {}: {} (it will run to the end)", job_id, e.what());
    return;
  }
  if (give_up_claims({job_id})) claim_now_ = true;
}

// Calls whose job is not running here: queued, finished by another daemon, cancelled from the
// CLI, or failed elsewhere. The store says which; final ones are answered.
void Service::api_resolve(bool force) {
  if (api_calls_.empty()) return;
  const int64_t now = steady_now_ms();
  if (!force && now - last_api_resolve_ms_ < kResolveEveryMs) return;
  last_api_resolve_ms_ = now;
  std::vector<int64_t> ids;
  for (const auto& [id, call] : api_calls_)
    if (!in_flight_.count(id)) ids.push_back(id);
  for (int64_t id : ids)
    if (!api_resolve_job(id)) return;
}

// One call whose job is not running here, answered if its job is final (or gone). False when
// the store could not be read: tried again later.
bool Service::api_resolve_job(int64_t id) {
  std::optional<Job> job;
  if (!store_read("looking up an API request's job", [&] { job = store_->get(id); })) return false;
  if (!job) {
    api_failed(id, {500, "the job of this request is gone", "", "job_missing", "server_error"});
  } else if (job->state == JobState::Done && job->result) {
    Completion c;
    c.id = id;
    c.result = *job->result;
    api_finished(c);
  } else if (job->state == JobState::Failed) {
    api_failed(id, {500, "generation failed: " + job->error.value_or("unknown error"), "",
                    "job_failed", "server_error"});
  } else if (job->state == JobState::Cancelled) {
    api_failed(id,
               {500, "the job of this request was cancelled", "", "job_cancelled", "server_error"});
  }
  return true;
}

// Shutdown: open requests cannot be answered any more; their jobs are cancelled so that no one
// runs them for a client that is gone.
void Service::api_close_all(const std::string& why) {
  std::vector<int64_t> ids;
  for (const auto& [id, call] : api_calls_) ids.push_back(id);
  for (int64_t id : ids) {
    // Skipped while the store refuses writes: the job then runs for no one, which is better
    // than holding the stop for the lock wait of every open request.
    store_write("cancelling an API job", [&] { store_->cancel(id); });
    api_failed(id, {503, why, "", "shutting_down", "server_error"});
  }
}

}  // namespace moebatch
