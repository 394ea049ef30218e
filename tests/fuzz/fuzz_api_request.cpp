// One request body of the OpenAI-compatible API (service/openai_api.*), as POST
// /v1/chat/completions and /v1/completions hand it over once Boost.Beast has read the HTTP
// message: the first byte picks the endpoint (even: chat, odd: completions; the seeds use '0'
// and '1'), the rest is the body. It is refused with an ApiError whose error body
// (render_error) is valid JSON carrying its fields unchanged, or accepted as an ApiRequest whose
// job passes the store's validation as the service submits it, whose stored chat prompt and
// template variables read back as the messages and options the service counted, and whose
// views (queue/job_json.*) serialize and parse back as JSON.
#include <nlohmann/json.hpp>

#include "queue/job_json.h"
#include "queue/job_validate.h"
#include "service/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;

// Strict: an accepted request holds valid UTF-8 only, so nothing needs replacing.
void dump_and_parse(const json& j) {
  if (json::parse(j.dump(), nullptr, false).is_discarded()) __builtin_trap();
}

json optional_field(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

void check_error(const moebatch::ApiError& e) {
  if ((e.status != 400 && e.status != 404) || e.message.empty() || e.type.empty()) __builtin_trap();
  // Printed leniently (dump_json) and read back strictly: every field arrives as it was, so
  // no message quotes a split character or loses one.
  const json r = json::parse(moebatch::render_error(e), nullptr, false);
  if (r.is_discarded() || !r.is_object() || !r.contains("error")) __builtin_trap();
  const json& err = r["error"];
  if (err.value("message", json()) != e.message || err.value("type", json()) != e.type ||
      err.value("param", json()) != optional_field(e.param) ||
      err.value("code", json()) != optional_field(e.code))
    __builtin_trap();
}

// The stored chat prompt, read as the dispatcher reads it (service/job_codec.cpp), holds the
// messages the service counted tokens of, and chat_template_kwargs gives the same options.
void check_chat(const moebatch::ApiRequest& r) {
  const json stored = json::parse(r.spec.prompt, nullptr, false);
  if (!stored.is_array() || stored.size() != r.messages.size() || r.messages.empty())
    __builtin_trap();
  for (size_t i = 0; i < stored.size(); ++i) {
    const json& m = stored[i];
    if (!m.is_object() || m.value("role", json()) != r.messages[i].role ||
        m.value("content", json()) != r.messages[i].content)
      __builtin_trap();
  }
  if (r.spec.chat_template_kwargs) {
    const auto opts = moebatch::chat_options_from_kwargs(
        json::parse(*r.spec.chat_template_kwargs, nullptr, false));
    const auto* o = std::get_if<moebatch::ChatOptions>(&opts);
    if (o == nullptr || o->enable_thinking != r.chat_options.enable_thinking) __builtin_trap();
  } else if (r.chat_options.enable_thinking) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto kind = (data[0] & 1) != 0 ? moebatch::ApiKind::Completion : moebatch::ApiKind::Chat;
  const moebatch::JobLimits limits;
  auto parsed = moebatch::parse_api_request(kind, moebatch::fuzz::as_text(data + 1, size - 1),
                                            "demo", limits);
  if (const auto* e = std::get_if<moebatch::ApiError>(&parsed)) {
    check_error(*e);
    return 0;
  }
  moebatch::ApiRequest& r = std::get<moebatch::ApiRequest>(parsed);
  if (r.kind != kind || r.spec.model != "demo" || (r.include_usage && !r.stream)) __builtin_trap();
  if (kind == moebatch::ApiKind::Chat) {
    if (r.spec.prompt_kind != moebatch::PromptKind::Chat) __builtin_trap();
    check_chat(r);
  } else if (r.spec.prompt_kind != moebatch::PromptKind::Text || !r.messages.empty() ||
             r.spec.chat_template_kwargs) {
    __builtin_trap();
  }
  // What the service fills in before JobStore::submit validates the job again (service_api.cpp;
  // the longest context leaves at most limits.max_tokens).
  if (!r.max_tokens_given) r.spec.sampling.max_tokens = limits.max_tokens;
  r.spec.batch_id = "openai-api";
  if (moebatch::find_job_spec_error(r.spec, limits)) __builtin_trap();
  moebatch::Job job;
  job.id = 1;
  job.spec = r.spec;
  dump_and_parse(moebatch::job_to_json(job));
  job.state = moebatch::JobState::Done;
  job.finished_at = 1764547200000;
  job.result = moebatch::JobResult{r.spec.prompt, 3, 2, "length", std::nullopt};
  dump_and_parse(moebatch::job_to_json(job));
  return 0;
}
