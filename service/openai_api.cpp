#include "service/openai_api.h"

#include <cmath>
#include <limits>

#include "common/json_parse.h"
#include "queue/json_strict.h"
#include "queue/openai_content.h"

namespace moebatch {
namespace {

using nlohmann::json;

// Thrown inside the parser, caught at its top: each check is one line.
using Bad = FieldError;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw Bad{param, message};
}

double number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) bad(param, "expected a number, got " + json_type_name(v));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    bad(param, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump());
  }
  return x;
}

int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    bad(param,
        "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  }
  if (!v.is_number_integer()) bad(param, "expected an integer, got " + json_type_name(v));
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) {
    bad(param, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                   std::to_string(x));
  }
  return x;
}

const std::string& string_of(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, "expected a string, got " + json_type_name(v));
  return v.get_ref<const std::string&>();
}

bool boolean(const json& v, const std::string& param) {
  if (!v.is_boolean()) bad(param, "expected a boolean, got " + json_type_name(v));
  return v.get<bool>();
}

// messages → the stored chat prompt ([{role, content[, name]}]) and the template's messages.
void parse_messages(const json& v, const JobLimits& limits, ApiRequest& out) {
  if (!v.is_array()) bad("messages", "expected an array, got " + json_type_name(v));
  if (v.empty()) bad("messages", "must hold at least one message");
  if (v.size() > limits.max_chat_messages) {
    bad("messages", std::to_string(v.size()) + " messages exceeds the limit of " +
                        std::to_string(limits.max_chat_messages));
  }
  json stored = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) bad(where, "expected an object, got " + json_type_name(m));
    std::string role, content;
    std::optional<std::string> name;
    bool have_role = false, have_content = false;
    for (const auto& [k, x] : m.items()) {
      if (k == "role") {
        role = string_of(x, where + ".role");
        have_role = true;
      } else if (k == "content") {
        content = message_content_text(x, where + ".content");
        have_content = true;
      } else if (k == "name") {
        name = string_of(x, where + ".name");
      } else {
        bad(where + "." + k, "unknown field of a message (role, content, name)");
      }
    }
    if (!have_role) bad(where + ".role", "missing");
    if (role != "system" && role != "developer" && role != "user" && role != "assistant") {
      bad(where + ".role", "'" + role + "' is not supported (system, developer, user, assistant)");
    }
    if (!have_content) bad(where + ".content", "missing");
    json sm{{"role", role}, {"content", content}};
    if (name) sm["name"] = *name;
    stored.push_back(std::move(sm));
    out.messages.push_back({role, content, std::nullopt});
  }
  out.spec.prompt_kind = PromptKind::Chat;
  out.spec.prompt = stored.dump();
}

void parse_prompt(const json& v, ApiRequest& out) {
  if (v.is_array()) {
    if (v.size() != 1 || !v[0].is_string()) {
      bad("prompt", "only one prompt per request: a string or an array of one string");
    }
    out.spec.prompt = v[0].get<std::string>();
  } else {
    out.spec.prompt = string_of(v, "prompt");
  }
  if (out.spec.prompt.empty()) bad("prompt", "must not be empty");
  out.spec.prompt_kind = PromptKind::Text;
}

void parse_stop(const json& v, SamplingParams& sp) {
  if (v.is_string()) {
    sp.stop = {v.get<std::string>()};
    return;
  }
  if (!v.is_array())
    bad("stop", "expected a string or an array of strings, got " + json_type_name(v));
  for (size_t i = 0; i < v.size(); ++i) sp.stop.push_back(string_of(v[i], "stop"));
}

// A field accepted only at its no-op value (what SDKs and Dify send by default).
void require_default(const std::string& key, const json& v) {
  if (v.is_null()) return;
  if (key == "presence_penalty" || key == "frequency_penalty") {
    if (number(v, key, -2, 2) != 0) bad(key, "not supported (only 0)");
  } else if (key == "logprobs") {
    if (v.is_boolean() ? v.get<bool>() : true) bad(key, "not supported (only false or null)");
  } else if (key == "top_logprobs") {
    if (integer(v, key, 0, 20) != 0) bad(key, "not supported (only 0)");
  } else if (key == "logit_bias") {
    if (!v.is_object() || !v.empty()) bad(key, "not supported (only {})");
  } else if (key == "response_format") {
    if (!v.is_object() || v.value("type", json()) != "text" || v.size() != 1)
      bad(key, "not supported (only {\"type\": \"text\"})");
  } else if (key == "echo") {
    if (boolean(v, key)) bad(key, "not supported (only false)");
  } else if (key == "best_of") {
    if (integer(v, key, 1, 1) != 1) bad(key, "only 1");
  } else if (key == "suffix") {
    bad(key, "not supported (only null)");
  }
}

void parse_fields(const json& body, const std::string& served_model, const JobLimits& limits,
                  ApiRequest& out) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  const bool chat = out.kind == ApiKind::Chat;
  SamplingParams& sp = out.spec.sampling;
  bool have_input = false, have_model = false;
  std::optional<int64_t> max_tokens, max_completion_tokens;
  for (const auto& [key, v] : body.items()) {
    if (key == "model") {
      const std::string& m = string_of(v, "model");
      if (m != served_model) {
        throw ApiError{
            404, "The model `" + m + "` does not exist; this server serves `" + served_model + "`.",
            "model", "model_not_found", "invalid_request_error"};
      }
      out.spec.model = m;
      have_model = true;
    } else if (chat && key == "messages") {
      parse_messages(v, limits, out);
      have_input = true;
    } else if (!chat && key == "prompt") {
      parse_prompt(v, out);
      have_input = true;
    } else if (v.is_null() && key != "stream_options" && key != "chat_template_kwargs") {
      continue;  // null means "default" for every optional field
    } else if (key == "temperature") {
      sp.temperature = number(v, key, 0, 2);
    } else if (key == "top_p") {
      sp.top_p = number(v, key, 0, 1);
      if (sp.top_p <= 0) bad(key, "must be in (0, 1], got " + v.dump());
    } else if (key == "top_k") {
      sp.top_k = std::max<int64_t>(0, integer(v, key, -1, 1000000));  // -1: off, as vLLM
    } else if (key == "seed") {
      sp.seed =
          integer(v, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    } else if (key == "stop") {
      parse_stop(v, sp);
    } else if (key == "max_tokens") {
      max_tokens = integer(v, key, 1, limits.max_tokens);
    } else if (chat && key == "max_completion_tokens") {
      max_completion_tokens = integer(v, key, 1, limits.max_tokens);
    } else if (key == "n") {
      if (integer(v, key, 1, 128) != 1) bad(key, "only n = 1 is supported");
    } else if (key == "stream") {
      out.stream = boolean(v, key);
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) bad(key, "expected an object, got " + json_type_name(v));
      for (const auto& [k, x] : v.items()) {
        if (k == "include_usage") {
          out.include_usage = x.is_null() ? false : boolean(x, "stream_options.include_usage");
        } else if (k != "continuous_usage_stats") {
          bad("stream_options." + k, "unknown field (include_usage)");
        }
      }
    } else if (chat && key == "chat_template_kwargs") {
      if (v.is_null()) continue;
      auto opts = chat_options_from_kwargs(v);
      if (auto* e = std::get_if<std::string>(&opts)) bad("chat_template_kwargs", *e);
      out.chat_options = std::get<ChatOptions>(opts);
      out.spec.chat_template_kwargs = v.dump();
    } else if (key == "user") {
      out.spec.user = string_of(v, key);  // kept with the job, as a batch line's is
    } else if (key == "presence_penalty" || key == "frequency_penalty" || key == "logprobs" ||
               key == "logit_bias" || (chat && key == "top_logprobs") ||
               (chat && key == "response_format") || (!chat && key == "echo") ||
               (!chat && key == "best_of") || (!chat && key == "suffix")) {
      require_default(key, v);
    } else {
      bad(key, "Unrecognized request argument supplied: " + key);
    }
  }
  if (!have_model) bad("model", "missing (this server serves `" + served_model + "`)");
  if (!have_input) bad(chat ? "messages" : "prompt", "missing");
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens) {
    bad("max_completion_tokens", "differs from max_tokens; give one of them");
  }
  if (auto m = max_completion_tokens ? max_completion_tokens : max_tokens) {
    sp.max_tokens = *m;
    out.max_tokens_given = true;
  }
  if (out.include_usage && !out.stream) bad("stream_options", "only allowed with stream: true");
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json envelope(const ApiResponseId& rid, bool chunk) {
  const bool chat = rid.kind == ApiKind::Chat;
  return {
      {"id", rid.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", rid.created},
      {"model", rid.model}};
}

}  // namespace

std::variant<ChatOptions, std::string> chat_options_from_kwargs(const json& kwargs) {
  if (!kwargs.is_object())
    return "chat_template_kwargs: expected an object, got " + json_type_name(kwargs);
  ChatOptions o;
  for (const auto& [k, v] : kwargs.items()) {
    if (k == "enable_thinking") {
      if (!v.is_boolean()) return "chat_template_kwargs.enable_thinking: expected a boolean";
      o.enable_thinking = v.get<bool>();
    } else {
      return "chat_template_kwargs." + k +
             ": not supported by this model's chat template (supported: enable_thinking)";
    }
  }
  return o;
}

std::variant<ApiRequest, ApiError> parse_api_request(ApiKind kind, std::string_view body,
                                                     const std::string& served_model,
                                                     const JobLimits& limits) {
  // Strict, as the queue's other doors (ZeroMQ, batch lines): duplicate keys and nesting past
  // kMaxJsonDepth are refused.
  std::string problem;
  const json j = parse_json_strict(body, &problem);
  if (!problem.empty())
    return invalid_request("the request body is " +
                           (problem == "not valid JSON" ? problem : "refused: " + problem));
  ApiRequest out;
  out.kind = kind;
  try {
    parse_fields(j, served_model, limits, out);
    // The queue's own checks (sizes, UTF-8, stop strings) with the queue's words.
    if (auto e = find_job_spec_error(out.spec, limits)) {
      const std::string param = e->substr(0, e->find(':'));
      throw Bad{param, *e};
    }
  } catch (const Bad& b) {
    // Messages that already start with their field (the queue's, the template's) stay as they are.
    const bool named = b.field.empty() || b.message.rfind(b.field, 0) == 0;
    return invalid_request(named ? b.message : b.field + ": " + b.message, b.field);
  } catch (const ApiError& e) {
    return e;
  }
  return out;
}

std::string render_response(const ApiResponseId& rid, const ApiResult& r) {
  json j = envelope(rid, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}};
  if (rid.kind == ApiKind::Chat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  } else {
    choice["text"] = r.text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r.prompt_tokens, r.completion_tokens);
  return dump_json(j);
}

std::string render_chunk(const ApiResponseId& rid, std::string_view delta, bool first,
                         const std::optional<std::string>& finish_reason, bool with_usage) {
  json j = envelope(rid, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  if (rid.kind == ApiKind::Chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || first) d["content"] = delta;
    choice["delta"] = std::move(d);
  } else {
    choice["text"] = delta;
  }
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  j["choices"] = json::array({choice});
  if (with_usage) j["usage"] = nullptr;
  return "data: " + dump_json(j) + "\n\n";
}

std::string render_usage_chunk(const ApiResponseId& rid, int64_t prompt_tokens,
                               int64_t completion_tokens) {
  json j = envelope(rid, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(prompt_tokens, completion_tokens);
  return "data: " + dump_json(j) + "\n\n";
}

std::string render_error(const ApiError& e) {
  json err{{"message", e.message},
           {"type", e.type},
           {"param", e.param.empty() ? json(nullptr) : json(e.param)},
           {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return dump_json(json{{"error", err}});
}

std::string render_stream_error(const ApiError& e) { return "data: " + render_error(e) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

namespace {

json model_json(const std::string& model, int64_t created, int64_t max_model_len) {
  return {{"id", model},
          {"object", "model"},
          {"created", created},
          {"owned_by", "moebatch"},
          {"root", model},
          {"parent", nullptr},
          {"max_model_len", max_model_len}};
}

}  // namespace

std::string render_models(const std::string& model, int64_t created, int64_t max_model_len) {
  return dump_json(
      json{{"object", "list"}, {"data", json::array({model_json(model, created, max_model_len)})}});
}

std::string render_model(const std::string& model, int64_t created, int64_t max_model_len) {
  return dump_json(model_json(model, created, max_model_len));
}

}  // namespace moebatch
