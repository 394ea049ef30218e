#include "queue/zmq/protocol.h"

#include <limits>

#include "queue/json_strict.h"

namespace moebatch::zmq_ingress {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view code, std::string message,
                       std::optional<std::string> field = std::nullopt) {
  throw ProtocolException(ProtocolError{std::string(code), std::move(message), std::move(field)});
}

[[noreturn]] void invalid(const std::string& field, const std::string& message) {
  fail(error_code::kInvalid, field + ": " + message, field);
}

std::string child(const std::string& path, std::string_view name) {
  return path.empty() ? std::string(name) : path + "." + std::string(name);
}

std::string get_string(const json& v, const std::string& field) {
  if (!v.is_string()) invalid(field, "must be a string");
  return v.get<std::string>();
}

int64_t get_int(const json& v, const std::string& field) {
  // nlohmann stores non-negative integers as unsigned: check the range before converting.
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      invalid(field, "is too large");
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  invalid(field, "must be an integer");
}

double get_number(const json& v, const std::string& field) {
  if (!v.is_number()) invalid(field, "must be a number");
  return v.get<double>();
}

const json* find(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

/// Maps a JobSpec validation message "field: reason" to the protocol's JSON field name.
[[noreturn]] void rethrow_spec_error(const std::string& problem, const std::string& path,
                                     PromptKind kind) {
  const size_t colon = problem.find(": ");
  std::string field = colon == std::string::npos ? std::string() : problem.substr(0, colon);
  const std::string reason = colon == std::string::npos ? problem : problem.substr(colon + 2);
  if (field == "client_key") field = "key";
  if (field == "prompt" && kind == PromptKind::Chat) field = "messages";
  const std::string full = field.empty() ? path : child(path, field);
  invalid(full, reason);
}

nlohmann::json parse_id(const json& doc, const ProtocolLimits& limits) {
  const json* id = find(doc, "id");
  if (id == nullptr) fail(error_code::kInvalid, "id: required", "id");
  if (id->is_string()) {
    if (id->get_ref<const std::string&>().size() > limits.max_request_id_bytes) {
      fail(error_code::kInvalid,
           "id: longer than " + std::to_string(limits.max_request_id_bytes) + " bytes", "id");
    }
    return *id;
  }
  if (id->is_number_integer()) return *id;
  fail(error_code::kInvalid, "id: must be a string or an integer", "id");
}

void parse_job_ref(const json& doc, Request& r) {
  const json* id = find(doc, "job_id");
  const json* key = find(doc, "key");
  if ((id == nullptr) == (key == nullptr)) {
    invalid("job_id", "exactly one of job_id or key is required");
  }
  if (id != nullptr) {
    const int64_t v = get_int(*id, "job_id");
    if (v <= 0) invalid("job_id", "must be positive");
    r.job_id = v;
  } else {
    r.client_key = get_string(*key, "key");
    if (r.client_key->empty()) invalid("key", "must not be empty");
  }
}

void check_known(const json& doc, std::initializer_list<std::string_view> allowed,
                 const std::string& path) {
  for (const auto& [k, v] : doc.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || k == a;
    if (!known) invalid(child(path, k), "unknown field");
    (void)v;
  }
}

std::optional<Command> batch_command(std::string_view name) {
  if (name == "batch_status") return Command::BatchStatus;
  if (name == "batch_cancel") return Command::BatchCancel;
  if (name == "batch_retry") return Command::BatchRetry;
  if (name == "batch_purge") return Command::BatchPurge;
  if (name == "batch_results") return Command::BatchResults;
  return std::nullopt;
}

}  // namespace

JobSpec job_spec_from_json(const json& j, const std::string& path,
                           const std::optional<std::string>& default_batch,
                           const JobLimits& limits) {
  if (!j.is_object()) invalid(path, "must be an object");
  check_known(j,
              {"prompt", "messages", "key", "batch_id", "custom_id", "model", "priority",
               "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "max_attempts",
               "user", "metadata", "chat_template_kwargs"},
              path);
  JobSpec s;
  const json* prompt = find(j, "prompt");
  const json* messages = find(j, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    invalid(child(path, "prompt"), "exactly one of prompt or messages is required");
  }
  if (prompt != nullptr) {
    s.prompt = get_string(*prompt, child(path, "prompt"));
  } else {
    if (!messages->is_array()) invalid(child(path, "messages"), "must be an array");
    s.prompt_kind = PromptKind::Chat;
    s.prompt = messages->dump(-1, ' ', false, json::error_handler_t::strict);
  }
  if (const json* v = find(j, "key")) s.client_key = get_string(*v, child(path, "key"));
  if (const json* v = find(j, "batch_id")) {
    s.batch_id = get_string(*v, child(path, "batch_id"));
  } else {
    s.batch_id = default_batch;
  }
  if (const json* v = find(j, "custom_id")) s.custom_id = get_string(*v, child(path, "custom_id"));
  if (const json* v = find(j, "model")) s.model = get_string(*v, child(path, "model"));
  if (const json* v = find(j, "priority")) s.priority = get_int(*v, child(path, "priority"));
  SamplingParams& p = s.sampling;
  if (const json* v = find(j, "max_tokens")) p.max_tokens = get_int(*v, child(path, "max_tokens"));
  if (const json* v = find(j, "temperature")) {
    p.temperature = get_number(*v, child(path, "temperature"));
  }
  if (const json* v = find(j, "top_p")) p.top_p = get_number(*v, child(path, "top_p"));
  if (const json* v = find(j, "top_k")) p.top_k = get_int(*v, child(path, "top_k"));
  if (const json* v = find(j, "seed")) p.seed = get_int(*v, child(path, "seed"));
  if (const json* v = find(j, "stop")) {
    const std::string f = child(path, "stop");
    if (v->is_string()) {
      p.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      // Bounded before copying: the store's own check runs after, on the copied strings.
      if (v->size() > limits.max_stop) {
        invalid(f, std::to_string(v->size()) + " strings exceeds the limit of " +
                       std::to_string(limits.max_stop));
      }
      for (size_t i = 0; i < v->size(); ++i) {
        p.stop.push_back(get_string((*v)[i], f + "[" + std::to_string(i) + "]"));
      }
    } else {
      invalid(f, "must be a string or an array of strings");
    }
  }
  if (const json* v = find(j, "max_attempts")) {
    s.max_attempts = get_int(*v, child(path, "max_attempts"));
  }
  if (const json* v = find(j, "user")) s.user = get_string(*v, child(path, "user"));
  // Objects are kept as their JSON text; the store's checks bound and validate them.
  auto object_text = [&](const char* name) -> std::optional<std::string> {
    const json* v = find(j, name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_object()) invalid(child(path, name), "must be an object");
    return v->dump(-1, ' ', false, json::error_handler_t::strict);
  };
  s.metadata = object_text("metadata");
  s.chat_template_kwargs = object_text("chat_template_kwargs");
  if (auto e = find_job_spec_error(s, limits)) rethrow_spec_error(*e, path, s.prompt_kind);
  return s;
}

json job_spec_to_json(const JobSpec& s) {
  json j = json::object();
  if (s.prompt_kind == PromptKind::Chat) {
    j["messages"] = json::parse(s.prompt);
  } else {
    j["prompt"] = s.prompt;
  }
  if (s.client_key) j["key"] = *s.client_key;
  if (s.batch_id) j["batch_id"] = *s.batch_id;
  if (s.custom_id) j["custom_id"] = *s.custom_id;
  if (s.model) j["model"] = *s.model;
  j["priority"] = s.priority;
  j["max_tokens"] = s.sampling.max_tokens;
  j["temperature"] = s.sampling.temperature;
  j["top_p"] = s.sampling.top_p;
  j["top_k"] = s.sampling.top_k;
  if (s.sampling.seed) j["seed"] = *s.sampling.seed;
  if (!s.sampling.stop.empty()) j["stop"] = s.sampling.stop;
  j["max_attempts"] = s.max_attempts;
  if (s.user) j["user"] = *s.user;
  if (s.metadata) j["metadata"] = json::parse(*s.metadata);
  if (s.chat_template_kwargs) j["chat_template_kwargs"] = json::parse(*s.chat_template_kwargs);
  return j;
}

Request parse_request(std::string_view body, const ProtocolLimits& limits, json* id_out) {
  if (body.size() > limits.max_request_bytes) {
    fail(error_code::kTooLarge, "request of " + std::to_string(body.size()) +
                                    " bytes exceeds the limit of " +
                                    std::to_string(limits.max_request_bytes));
  }
  std::string problem;  // strict: duplicate keys, NUL in keys, nesting past kMaxJsonDepth
  json doc = parse_json_strict(body, &problem);
  if (doc.is_discarded()) {
    if (problem == "not valid JSON") fail(error_code::kBadJson, "request is not valid JSON");
    fail(error_code::kBadJson, "request JSON: " + problem);
  }
  if (!doc.is_object()) fail(error_code::kBadJson, "request must be a JSON object");
  Request r;
  r.id = parse_id(doc, limits);
  if (id_out != nullptr) *id_out = r.id;
  const json* v = find(doc, "v");
  if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() != kProtocolVersion) {
    fail(error_code::kBadVersion,
         "unsupported protocol version (this service speaks v=" + std::to_string(kProtocolVersion) +
             ")",
         "v");
  }
  const json* cmd = find(doc, "cmd");
  if (cmd == nullptr || !cmd->is_string()) {
    fail(error_code::kUnknownCommand, "cmd: required string", "cmd");
  }
  const std::string& name = cmd->get_ref<const std::string&>();
  if (name == "submit") {
    r.cmd = Command::Submit;
    check_known(doc, {"v", "cmd", "id", "jobs", "job", "batch_id"}, "");
    std::optional<std::string> batch;
    if (const json* b = find(doc, "batch_id")) batch = get_string(*b, "batch_id");
    const json* jobs = find(doc, "jobs");
    const json* one = find(doc, "job");
    if ((jobs == nullptr) == (one == nullptr)) {
      invalid("jobs", "exactly one of jobs (array) or job (object) is required");
    }
    if (one != nullptr) {
      r.single_job = true;
      r.jobs.push_back(job_spec_from_json(*one, "job", batch, limits.jobs));
    } else {
      if (!jobs->is_array()) invalid("jobs", "must be an array");
      if (jobs->empty()) invalid("jobs", "must not be empty");
      if (jobs->size() > limits.max_jobs_per_message) {
        fail(error_code::kTooManyJobs,
             std::to_string(jobs->size()) + " jobs exceeds the limit of " +
                 std::to_string(limits.max_jobs_per_message) + " per message",
             "jobs");
      }
      r.jobs.reserve(jobs->size());
      for (size_t i = 0; i < jobs->size(); ++i) {
        r.jobs.push_back(
            job_spec_from_json((*jobs)[i], "jobs[" + std::to_string(i) + "]", batch, limits.jobs));
      }
    }
  } else if (name == "status" || name == "result" || name == "cancel") {
    r.cmd =
        name == "status" ? Command::Status : (name == "result" ? Command::Result : Command::Cancel);
    check_known(doc, {"v", "cmd", "id", "job_id", "key"}, "");
    parse_job_ref(doc, r);
  } else if (name == "stats") {
    r.cmd = Command::Stats;
    check_known(doc, {"v", "cmd", "id"}, "");
  } else if (auto batch_cmd = batch_command(name)) {
    r.cmd = *batch_cmd;
    if (r.cmd == Command::BatchResults) {
      check_known(doc, {"v", "cmd", "id", "batch_id", "after_id", "limit"}, "");
    } else {
      check_known(doc, {"v", "cmd", "id", "batch_id"}, "");
    }
    const json* b = find(doc, "batch_id");
    if (b == nullptr) invalid("batch_id", "required");
    r.batch_id = get_string(*b, "batch_id");
    if (auto e = find_id_error("batch_id", r.batch_id, limits.jobs)) {
      rethrow_spec_error(*e, "", PromptKind::Text);
    }
    if (const json* a = find(doc, "after_id")) {
      r.after_id = get_int(*a, "after_id");
      if (r.after_id < 0) invalid("after_id", "must be >= 0");
    }
    if (const json* l = find(doc, "limit")) {
      r.limit = get_int(*l, "limit");
      if (r.limit < 1 || r.limit > kMaxResultsPage) {
        invalid("limit", "must be in [1, " + std::to_string(kMaxResultsPage) + "]");
      }
    }
  } else {
    fail(error_code::kUnknownCommand,
         "unknown command '" + name.substr(0, 64) +
             "' (submit|status|result|cancel|stats|batch_status|batch_cancel|batch_retry|"
             "batch_purge|batch_results)",
         "cmd");
  }
  return r;
}

std::string ok_reply(const json& id, json body) {
  json out = {{"v", kProtocolVersion}, {"id", id}, {"ok", true}};
  for (auto& [k, v] : body.items()) out[k] = std::move(v);
  return dump_json(out);
}

std::string error_reply(const json& id, const ProtocolError& err) {
  json e = {{"code", err.code},
            {"message", err.message},
            {"field", err.field ? json(*err.field) : json(nullptr)},
            {"retryable", err.retryable}};
  return dump_json({{"v", kProtocolVersion}, {"id", id}, {"ok", false}, {"error", e}});
}

json job_status_json(const Job& j) {
  auto opt_s = [](const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); };
  auto opt_i = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  return {{"id", j.id},
          {"key", opt_s(j.spec.client_key)},
          {"batch_id", opt_s(j.spec.batch_id)},
          {"custom_id", opt_s(j.spec.custom_id)},
          {"state", job_state_to_string(j.state)},
          {"attempts", j.attempts},
          {"max_attempts", j.spec.max_attempts},
          {"error", opt_s(j.error)},
          {"enqueued_at", j.enqueued_at},
          {"started_at", opt_i(j.started_at)},
          {"finished_at", opt_i(j.finished_at)}};
}

}  // namespace moebatch::zmq_ingress
