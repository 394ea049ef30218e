#include "queue/openai_batch.h"

#include <fstream>
#include <set>

#include "common/error.h"
#include "queue/json_strict.h"

namespace moebatch {
namespace {

using nlohmann::json;

constexpr std::string_view kChatUrl = "/v1/chat/completions";
constexpr std::string_view kCompletionsUrl = "/v1/completions";

[[noreturn]] void bad(size_t line_no, const std::string& field, const std::string& reason) {
  throw InputError("line " + std::to_string(line_no) + ": " + field + ": " + reason);
}

int64_t get_int(const json& v, size_t line_no, const std::string& field) {
  if (!v.is_number_integer()) bad(line_no, field, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad(line_no, field, "is too large");
  }
  return v.get<int64_t>();
}

double get_number(const json& v, size_t line_no, const std::string& field) {
  if (!v.is_number()) bad(line_no, field, "must be a number");
  return v.get<double>();
}

const std::string& get_string(const json& v, size_t line_no, const std::string& field) {
  if (!v.is_string()) bad(line_no, field, "must be a string");
  return v.get_ref<const std::string&>();
}

void parse_body(const json& body, bool chat, size_t line_no, JobSpec& spec) {
  if (!body.is_object()) bad(line_no, "body", "must be an object");
  if (chat && body.contains("max_tokens") && body.contains("max_completion_tokens")) {
    bad(line_no, "body.max_completion_tokens",
        "give max_tokens or max_completion_tokens, not both");
  }
  bool have_prompt = false;
  for (const auto& [key, v] : body.items()) {
    const std::string field = "body." + key;
    SamplingParams& p = spec.sampling;
    if (key == "model") {
      spec.model = get_string(v, line_no, field);
    } else if (chat && key == "messages") {
      if (!v.is_array()) bad(line_no, field, "must be an array");
      spec.prompt = v.dump();
      have_prompt = true;
    } else if (!chat && key == "prompt") {
      spec.prompt = get_string(v, line_no, field);
      have_prompt = true;
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      p.max_tokens = get_int(v, line_no, field);
    } else if (key == "temperature") {
      p.temperature = get_number(v, line_no, field);
    } else if (key == "top_p") {
      p.top_p = get_number(v, line_no, field);
    } else if (key == "top_k") {
      p.top_k = get_int(v, line_no, field);
    } else if (key == "seed") {
      p.seed = get_int(v, line_no, field);
    } else if (key == "stop") {
      p.stop.clear();
      if (v.is_string()) {
        p.stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const auto& s : v) p.stop.push_back(get_string(s, line_no, field + "[]"));
      } else if (!v.is_null()) {
        bad(line_no, field, "must be a string or an array of strings");
      }
    } else if (key == "n") {
      if (get_int(v, line_no, field) != 1) bad(line_no, field, "only n = 1 is supported");
    } else if (key == "stream") {
      if (!v.is_boolean() || v.get<bool>()) bad(line_no, field, "streaming is not supported");
    } else {
      bad(line_no, field, "unknown field");
    }
  }
  if (!have_prompt) bad(line_no, chat ? "body.messages" : "body.prompt", "missing");
}

}  // namespace

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

JobSpec parse_batch_line(std::string_view line, size_t line_no, const std::string& batch_id,
                         const JobLimits& limits) {
  std::string problem;
  json j = parse_json_strict(line, &problem);
  if (j.is_discarded()) bad(line_no, "line", problem);
  if (!j.is_object()) bad(line_no, "line", "must be a JSON object");
  for (const auto& [key, v] : j.items()) {
    (void)v;
    if (key != "custom_id" && key != "method" && key != "url" && key != "body") {
      bad(line_no, key, "unknown field (expected custom_id, method, url, body)");
    }
  }
  for (const char* required : {"custom_id", "method", "url", "body"}) {
    if (!j.contains(required)) bad(line_no, required, "missing");
  }
  JobSpec spec;
  spec.batch_id = batch_id;
  spec.custom_id = get_string(j["custom_id"], line_no, "custom_id");
  if (get_string(j["method"], line_no, "method") != "POST") {
    bad(line_no, "method", "must be \"POST\"");
  }
  const std::string& url = get_string(j["url"], line_no, "url");
  if (url != kChatUrl && url != kCompletionsUrl) {
    bad(line_no, "url",
        "'" + url +
            "' is not supported (use /v1/chat/completions or "
            "/v1/completions)");
  }
  const bool chat = url == kChatUrl;
  spec.prompt_kind = chat ? PromptKind::Chat : PromptKind::Text;
  parse_body(j["body"], chat, line_no, spec);
  spec.client_key = batch_client_key(batch_id, *spec.custom_id);
  if (auto e = find_job_spec_error(spec, limits)) {
    throw InputError("line " + std::to_string(line_no) + ": " + *e);
  }
  return spec;
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
  const std::string where = path.string() + ":";
  while (std::getline(in, line)) {
    ++line_no;
    bytes += line.size() + 1;
    if (progress && line_no % 1024 == 0) progress(bytes, total);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (++out.lines > file_limits.max_lines) {
      throw InputError(where + "line " + std::to_string(line_no) + ": file has more than " +
                       std::to_string(file_limits.max_lines) + " requests");
    }
    try {
      if (line.size() > file_limits.max_line_bytes) {
        bad(line_no, "line",
            std::to_string(line.size()) + " bytes exceeds the limit of " +
                std::to_string(file_limits.max_line_bytes));
      }
      JobSpec spec = parse_batch_line(line, line_no, batch_id, limits);
      if (!custom_ids.insert(*spec.custom_id).second) {
        bad(line_no, "custom_id", "'" + *spec.custom_id + "' repeats an earlier line");
      }
      out.specs.push_back(std::move(spec));
    } catch (const InputError& e) {
      out.errors.push_back(where + e.what());
      if (out.errors.size() >= file_limits.max_errors) {
        out.errors.push_back(where + " stopped after " + std::to_string(out.errors.size()) +
                             " errors");
        break;
      }
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

}  // namespace moebatch
