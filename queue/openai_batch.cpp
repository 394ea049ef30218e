#include "queue/openai_batch.h"

#include <fstream>
#include <set>

#include "common/error.h"
#include "queue/json_strict.h"
#include "queue/openai_content.h"

namespace moebatch {
namespace {

using nlohmann::json;

constexpr std::string_view kChatUrl = "/v1/chat/completions";
constexpr std::string_view kCompletionsUrl = "/v1/completions";

// Thrown inside the line parser and caught at its top, so each check is one line.
using Bad = FieldError;

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw Bad{field, message};
}

int64_t get_int(const json& v, const std::string& field) {
  if (!v.is_number_integer()) bad(field, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad(field, "is too large");
  }
  return v.get<int64_t>();
}

double get_number(const json& v, const std::string& field) {
  if (!v.is_number()) bad(field, "must be a number");
  return v.get<double>();
}

const std::string& get_string(const json& v, const std::string& field) {
  if (!v.is_string()) bad(field, "must be a string");
  return v.get_ref<const std::string&>();
}

// messages -> the stored chat prompt [{role, content[, name]}], content parts joined. Roles and
// limits are checked with the rest of the job by find_job_spec_error.
std::string chat_prompt(const json& v, const std::string& field) {
  if (!v.is_array()) bad(field, "must be an array");
  json stored = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = field + "[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) bad(where, "must be an object");
    json sm = json::object();
    for (const auto& [k, x] : m.items()) {
      if (k == "role" || k == "name") {
        sm[k] = get_string(x, where + "." + k);
      } else if (k == "content") {
        sm[k] = message_content_text(x, where + ".content");
      } else {
        bad(where + "." + k, "not supported (role, content, name)");
      }
    }
    stored.push_back(std::move(sm));
  }
  return stored.dump();
}

std::string metadata_of(const json& v, const std::string& field) {
  if (!v.is_object()) bad(field, "must be an object of strings");
  const std::string text = v.dump();
  if (auto e = find_metadata_error(text)) bad(field, e->substr(e->find(": ") + 2));
  return text;
}

// A field the engine cannot honour is accepted only at its no-op value, which SDKs send by
// default; true when `key` is one of them (and its value is that no-op).
bool accept_noop(const std::string& key, const json& v, bool chat, const std::string& field) {
  auto only = [&](bool ok, const char* what) {
    if (!ok) bad(field, std::string("not supported by this engine (only ") + what + ")");
    return true;
  };
  if (key == "presence_penalty" || key == "frequency_penalty") {
    return only(v.is_number() && v.get<double>() == 0, "0");
  }
  if (key == "logprobs") return only(v.is_boolean() && !v.get<bool>(), "false");
  if (key == "logit_bias") return only(v.is_object() && v.empty(), "{}");
  if (key == "store") return only(v.is_boolean() && !v.get<bool>(), "false");
  if (key == "parallel_tool_calls") return only(v.is_boolean(), "a boolean");
  if (key == "service_tier") return only(v.is_string(), "a string");
  if (chat && key == "top_logprobs")
    return only(v.is_number_integer() && v.get<int64_t>() == 0, "0");
  if (chat && key == "response_format") {
    return only(v.is_object() && v.size() == 1 && v.value("type", json()) == "text",
                "{\"type\": \"text\"}");
  }
  if (chat && key == "tools") return only(v.is_array() && v.empty(), "[]");
  if (chat && key == "tool_choice") return only(v == "none", "\"none\"");
  if (chat && key == "modalities") return only(v == json::array({"text"}), "[\"text\"]");
  if (!chat && key == "echo") return only(v.is_boolean() && !v.get<bool>(), "false");
  if (!chat && key == "best_of") return only(v.is_number_integer() && v.get<int64_t>() == 1, "1");
  if (!chat && key == "suffix") return only(false, "null");
  return false;
}

void parse_body(const json& body, bool chat, JobSpec& spec) {
  if (!body.is_object()) bad("body", "must be an object");
  if (chat && body.contains("max_tokens") && body.contains("max_completion_tokens")) {
    bad("body.max_completion_tokens", "give max_tokens or max_completion_tokens, not both");
  }
  bool have_prompt = false;
  for (const auto& [key, v] : body.items()) {
    const std::string field = "body." + key;
    SamplingParams& p = spec.sampling;
    if (chat && key == "messages") {
      spec.prompt = chat_prompt(v, field);
      have_prompt = true;
    } else if (!chat && key == "prompt") {
      if (v.is_array() && v.size() == 1) {
        spec.prompt = get_string(v[0], field + "[0]");
      } else if (v.is_array()) {
        bad(field, "one prompt per request: a string or an array of one string");
      } else {
        spec.prompt = get_string(v, field);
      }
      have_prompt = true;
    } else if (v.is_null()) {
      continue;  // null means "default" for every optional field
    } else if (key == "model") {
      spec.model = get_string(v, field);
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      p.max_tokens = get_int(v, field);
    } else if (key == "temperature") {
      p.temperature = get_number(v, field);
    } else if (key == "top_p") {
      p.top_p = get_number(v, field);
    } else if (key == "top_k") {
      const int64_t k = get_int(v, field);
      p.top_k = k == -1 ? 0 : k;  // -1: off, as vLLM
    } else if (key == "seed") {
      p.seed = get_int(v, field);
    } else if (key == "stop") {
      p.stop.clear();
      if (v.is_string()) {
        p.stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const auto& s : v) p.stop.push_back(get_string(s, field + "[]"));
      } else {
        bad(field, "must be a string or an array of strings");
      }
    } else if (key == "n") {
      if (get_int(v, field) != 1) bad(field, "only n = 1 is supported");
    } else if (key == "stream") {
      if (!v.is_boolean() || v.get<bool>()) bad(field, "streaming is not supported");
    } else if (key == "stream_options") {
      bad(field, "only with stream, which a batch does not support");
    } else if (chat && key == "chat_template_kwargs") {
      if (!v.is_object()) bad(field, "must be an object");
      spec.chat_template_kwargs = v.dump();
    } else if (key == "user") {
      spec.user = get_string(v, field);
    } else if (key == "metadata") {
      spec.metadata = metadata_of(v, field);
    } else if (!accept_noop(key, v, chat, field)) {
      bad(field, "unknown field");
    }
  }
  if (!have_prompt) bad(chat ? "body.messages" : "body.prompt", "missing");
}

JobSpec parse_request(std::string_view line, const std::string& batch_id, const JobLimits& limits,
                      std::optional<std::string>& custom_id) {
  std::string problem;
  json j = parse_json_strict(line, &problem);
  if (j.is_discarded()) bad("line", problem);
  if (!j.is_object()) bad("line", "must be a JSON object");
  // Read first, so every later error of the line can name its request.
  if (auto c = j.find("custom_id"); c != j.end() && c->is_string())
    custom_id = c->get<std::string>();
  for (const auto& [key, v] : j.items()) {
    (void)v;
    if (key != "custom_id" && key != "method" && key != "url" && key != "body") {
      bad(key, "unknown field (expected custom_id, method, url, body)");
    }
  }
  for (const char* required : {"custom_id", "method", "url", "body"}) {
    if (!j.contains(required)) bad(required, "missing");
  }
  JobSpec spec;
  spec.batch_id = batch_id;
  spec.custom_id = get_string(j["custom_id"], "custom_id");
  if (get_string(j["method"], "method") != "POST") bad("method", "must be \"POST\"");
  const std::string& url = get_string(j["url"], "url");
  if (url != kChatUrl && url != kCompletionsUrl) {
    bad("url", "'" + url + "' is not supported (use /v1/chat/completions or /v1/completions)");
  }
  const bool chat = url == kChatUrl;
  spec.prompt_kind = chat ? PromptKind::Chat : PromptKind::Text;
  parse_body(j["body"], chat, spec);
  spec.client_key = batch_client_key(batch_id, *spec.custom_id);
  if (auto e = find_job_spec_error(spec, limits)) {
    const size_t colon = e->find(": ");
    if (colon == std::string::npos) bad("body", *e);
    bad(e->substr(0, colon), e->substr(colon + 2));
  }
  return spec;
}

}  // namespace

std::string BatchLineError::text() const {
  return "line " + std::to_string(line) + ": " + field + ": " + message;
}

std::string batch_client_key(std::string_view batch_id, std::string_view custom_id) {
  std::string key;
  key.reserve(batch_id.size() + custom_id.size() + 1);
  for (char c : batch_id) {
    if (c == '\\' || c == '/') key.push_back('\\');
    key.push_back(c);
  }
  key.push_back('/');
  key.append(custom_id);
  return key;
}

std::variant<JobSpec, BatchLineError> parse_batch_request(std::string_view line, size_t line_no,
                                                          const std::string& batch_id,
                                                          const JobLimits& limits) {
  std::optional<std::string> custom_id;
  try {
    return parse_request(line, batch_id, limits, custom_id);
  } catch (const Bad& b) {
    return BatchLineError{line_no, b.field, b.message, custom_id};
  }
}

JobSpec parse_batch_line(std::string_view line, size_t line_no, const std::string& batch_id,
                         const JobLimits& limits) {
  auto r = parse_batch_request(line, line_no, batch_id, limits);
  if (auto* e = std::get_if<BatchLineError>(&r)) throw InputError(e->text());
  return std::move(std::get<JobSpec>(r));
}

BatchFile read_batch_file(const std::filesystem::path& path, const std::string& batch_id,
                          const JobLimits& limits, const BatchFileLimits& file_limits,
                          const std::function<void(size_t, size_t)>& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open batch file '" + path.string() + "'");
  std::error_code ec;
  const auto total = static_cast<size_t>(std::filesystem::file_size(path, ec));
  BatchFile out;
  std::set<std::string> custom_ids;
  std::string line;
  size_t line_no = 0;
  size_t bytes = 0;
  while (std::getline(in, line)) {
    ++line_no;
    bytes += line.size() + 1;
    if (progress && line_no % 1024 == 0) progress(bytes, total);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (++out.lines > file_limits.max_lines) {
      throw InputError(path.string() + ":line " + std::to_string(line_no) +
                       ": file has more than " + std::to_string(file_limits.max_lines) +
                       " requests");
    }
    std::variant<JobSpec, BatchLineError> r =
        line.size() > file_limits.max_line_bytes
            ? BatchLineError{line_no, "line",
                             std::to_string(line.size()) + " bytes exceeds the limit of " +
                                 std::to_string(file_limits.max_line_bytes),
                             std::nullopt}
            : parse_batch_request(line, line_no, batch_id, limits);
    if (auto* spec = std::get_if<JobSpec>(&r)) {
      if (custom_ids.insert(*spec->custom_id).second) {
        out.specs.push_back(std::move(*spec));
        out.spec_lines.push_back(line_no);
        continue;
      }
      r = BatchLineError{line_no, "custom_id", "'" + *spec->custom_id + "' repeats an earlier line",
                         spec->custom_id};
    }
    out.errors.push_back(std::move(std::get<BatchLineError>(r)));
    if (out.errors.size() >= file_limits.max_errors) {
      out.stopped_early = true;
      break;
    }
  }
  if (in.bad()) throw InputError("error reading batch file '" + path.string() + "'");
  if (progress) progress(total, total);
  return out;
}

json batch_output_line(const Job& job) {
  MB_CHECK(job_state_is_final(job.state), "export needs a finished job");
  json out;
  out["id"] = "batch_req_" + std::to_string(job.id);
  out["custom_id"] = job.spec.custom_id ? json(*job.spec.custom_id) : json(nullptr);
  if (job.state != JobState::Done || !job.result) {
    out["response"] = nullptr;
    out["error"] = {{"code", job.state == JobState::Cancelled ? "cancelled" : "job_failed"},
                    {"message", job.error.value_or(std::string(job_state_to_string(job.state)))}};
    return out;
  }
  const JobResult& r = *job.result;
  const bool chat = job.spec.prompt_kind == PromptKind::Chat;
  json choice = {{"index", 0}, {"finish_reason", r.finish_reason}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  } else {
    choice["text"] = r.text;
  }
  json body = {
      {"id", (chat ? "chatcmpl-" : "cmpl-") + std::to_string(job.id)},
      {"object", chat ? "chat.completion" : "text_completion"},
      {"created", job.finished_at.value_or(0) / 1000},
      {"model", job.spec.model.value_or("")},
      {"choices", json::array({choice})},
      {"usage",
       {{"prompt_tokens", r.prompt_tokens},
        {"completion_tokens", r.completion_tokens},
        {"total_tokens", r.prompt_tokens + r.completion_tokens}}},
  };
  out["response"] = {
      {"status_code", 200}, {"request_id", "req_" + std::to_string(job.id)}, {"body", body}};
  out["error"] = nullptr;
  return out;
}

json batch_error_line(const BatchLineError& e) {
  json error = {{"message", e.text()},
                {"type", "invalid_request_error"},
                {"param", e.field},
                {"code", "invalid_request"},
                {"line", e.line}};
  return {
      {"id", "batch_req_line_" + std::to_string(e.line)},
      {"custom_id", e.custom_id ? json(*e.custom_id) : json(nullptr)},
      {"response", {{"status_code", 400}, {"request_id", nullptr}, {"body", {{"error", error}}}}},
      {"error", nullptr}};
}

}  // namespace moebatch
