#include "queue/job_row.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/utf8.h"

namespace moebatch {

const char* const kJobColumns =
    "id, client_key, batch_id, custom_id, model, priority, prompt_kind, prompt, max_tokens, "
    "temperature, top_p, top_k, seed, stop, state, attempts, max_attempts, lease_owner, "
    "lease_expires_at, error, enqueued_at, not_before, started_at, first_token_at, finished_at, "
    "result_text, prompt_tokens, completion_tokens, finish_reason, chat_template_kwargs, "
    "lease_token, end_user, metadata";

namespace {

// Column indexes in kJobColumns.
enum Col {
  kId,
  kClientKey,
  kBatchId,
  kCustomId,
  kModel,
  kPriority,
  kPromptKind,
  kPrompt,
  kMaxTokens,
  kTemperature,
  kTopP,
  kTopK,
  kSeed,
  kStop,
  kState,
  kAttempts,
  kMaxAttempts,
  kLeaseOwner,
  kLeaseExpires,
  kError,
  kEnqueuedAt,
  kNotBefore,
  kStartedAt,
  kFirstTokenAt,
  kFinishedAt,
  kResultText,
  kPromptTokens,
  kCompletionTokens,
  kFinishReason,
  kChatTemplateKwargs,
  kLeaseToken,
  kEndUser,
  kMetadata
};

// prompt_kind: values longer than this are not read; bad ones are quoted up to kRowKindQuoteMax.
constexpr size_t kRowKindReadMax = 64;
constexpr size_t kRowKindQuoteMax = 32;

const char* type_name(RowSource::Type t) {
  switch (t) {
    case RowSource::Type::Integer:
      return "integer";
    case RowSource::Type::Real:
      return "real";
    case RowSource::Type::Text:
      return "text";
    case RowSource::Type::Other:
      return "blob";
    default:
      return "null";
  }
}

// SQLite's storage classes, as the decoder sees them.
class SqliteRow : public RowSource {
 public:
  explicit SqliteRow(const Stmt& s) : s_(s) {}
  Type type(int col) const override {
    switch (s_.type(col)) {
      case SQLITE_NULL:
        return Type::Null;
      case SQLITE_INTEGER:
        return Type::Integer;
      case SQLITE_FLOAT:
        return Type::Real;
      case SQLITE_TEXT:
        return Type::Text;
      default:
        return Type::Other;
    }
  }
  int64_t i64(int col) const override { return s_.i64(col); }
  double f64(int col) const override { return s_.f64(col); }
  std::string text(int col) const override { return s_.text(col); }
  size_t text_bytes(int col) const override { return s_.text_bytes(col); }

 private:
  const Stmt& s_;
};

// Reads columns while remembering the first one whose storage type is wrong.
class Reader {
 public:
  using Type = RowSource::Type;
  explicit Reader(const RowSource& s) : s_(s) {}

  int64_t req_int(int col, const char* name) {
    if (s_.type(col) != Type::Integer) {
      bad(col, name, "an integer");
      return 0;
    }
    return s_.i64(col);
  }
  std::optional<int64_t> opt_int(int col, const char* name) {
    if (s_.type(col) == Type::Null) return std::nullopt;
    return req_int(col, name);
  }
  double req_real(int col, const char* name) {
    const Type t = s_.type(col);
    if (t == Type::Integer) return static_cast<double>(s_.i64(col));
    if (t != Type::Real) {
      bad(col, name, "a number");
      return 0;
    }
    return s_.f64(col);
  }
  // Text of at most max_bytes: a longer value is refused without being copied ("" or nullopt),
  // with the message validation would give it.
  std::string req_text(int col, const char* name, size_t max_bytes) {
    if (s_.type(col) != Type::Text) {
      bad(col, name, "text");
      return {};
    }
    if (!fits(col, name, max_bytes)) return {};
    return s_.text(col);
  }
  std::optional<std::string> opt_text(int col, const char* name, size_t max_bytes) {
    if (s_.type(col) == Type::Null) return std::nullopt;
    if (s_.type(col) == Type::Text && !fits(col, name, max_bytes)) return std::nullopt;
    return req_text(col, name, max_bytes);
  }
  // Columns the service writes itself (results, errors, lease owners): read whole.
  std::optional<std::string> opt_own_text(int col, const char* name) {
    return opt_text(col, name, std::string::npos);
  }
  size_t bytes(int col) const { return s_.text_bytes(col); }
  void fail(std::string msg) {
    if (!error) error = std::move(msg);
  }

  std::optional<std::string> error;

 private:
  void bad(int col, const char* name, const char* want) {
    fail(std::string(name) + ": expected " + want + ", found " + type_name(s_.type(col)));
  }
  bool fits(int col, const char* name, size_t max_bytes) {
    const size_t n = s_.text_bytes(col);
    if (n <= max_bytes) return true;
    fail(std::string(name) + ": " + std::to_string(n) + " bytes exceeds the limit of " +
         std::to_string(max_bytes));
    return false;
  }
  const RowSource& s_;
};

}  // namespace

size_t stored_stop_max_bytes(const JobLimits& limits) {
  return limits.max_stop * (6 * limits.max_stop_bytes + 8) + 8;
}

size_t stored_metadata_max_bytes() { return 16 * (6 * (64 + 512) + 8) + 8; }

JobRow read_job_row(const Stmt& s, const JobLimits& limits) {
  return decode_job_row(SqliteRow(s), limits);
}

JobRow decode_job_row(const RowSource& s, const JobLimits& limits) {
  Reader r(s);
  JobRow row;
  Job& j = row.job;
  j.id = s.i64(kId);
  JobSpec& spec = j.spec;
  const size_t id_max = limits.max_id_bytes;
  spec.client_key = r.opt_text(kClientKey, "client_key", id_max);
  spec.batch_id = r.opt_text(kBatchId, "batch_id", id_max);
  spec.custom_id = r.opt_text(kCustomId, "custom_id", id_max);
  spec.model = r.opt_text(kModel, "model", id_max);
  spec.user = r.opt_text(kEndUser, "end_user", id_max);
  spec.metadata = r.opt_text(kMetadata, "metadata", stored_metadata_max_bytes());
  spec.priority = r.req_int(kPriority, "priority");
  // The kind is quoted in the row's error, which the claim writes back: only a short excerpt, or
  // a huge value would make that UPDATE too big and the same row would stop every claim.
  if (s.type(kPromptKind) == RowSource::Type::Text && r.bytes(kPromptKind) > kRowKindReadMax) {
    r.fail("prompt_kind: a " + std::to_string(r.bytes(kPromptKind)) +
           "-byte value is not one of text|chat");
  } else {
    const std::string kind = r.req_text(kPromptKind, "prompt_kind", kRowKindReadMax);
    if (auto k = prompt_kind_from_string(kind)) {
      spec.prompt_kind = *k;
    } else {
      r.fail("prompt_kind: '" + utf8_excerpt(kind, kRowKindQuoteMax) + "' is not one of text|chat");
    }
  }
  spec.prompt = r.req_text(kPrompt, "prompt", limits.max_prompt_bytes);
  spec.chat_template_kwargs =
      r.opt_text(kChatTemplateKwargs, "chat_template_kwargs", limits.max_template_kwargs_bytes);
  SamplingParams& p = spec.sampling;
  p.max_tokens = r.req_int(kMaxTokens, "max_tokens");
  p.temperature = r.req_real(kTemperature, "temperature");
  p.top_p = r.req_real(kTopP, "top_p");
  p.top_k = r.req_int(kTopK, "top_k");
  p.seed = r.opt_int(kSeed, "seed");
  // Measured before parsing: 100 MB of ["","",...] would be millions of strings before the
  // max_stop check could see them.
  if (auto stop = r.opt_text(kStop, "stop", stored_stop_max_bytes(limits))) {
    const nlohmann::json js = parse_json_bounded(*stop);
    if (js.is_array() && std::all_of(js.begin(), js.end(), [](auto& e) { return e.is_string(); })) {
      for (const auto& e : js) p.stop.push_back(e.get<std::string>());
    } else {
      r.fail("stop: must be a JSON array of strings");
    }
  }
  // The CHECK constraint on state guarantees a known value.
  j.state = job_state_from_string(s.text(kState)).value_or(JobState::Failed);
  j.lease_token = s.type(kLeaseToken) == RowSource::Type::Integer ? s.i64(kLeaseToken) : 0;
  j.attempts = r.req_int(kAttempts, "attempts");
  spec.max_attempts = r.req_int(kMaxAttempts, "max_attempts");
  j.lease_owner = r.opt_own_text(kLeaseOwner, "lease_owner");
  j.lease_expires_at = r.opt_int(kLeaseExpires, "lease_expires_at");
  j.error = r.opt_own_text(kError, "error");
  j.enqueued_at = r.req_int(kEnqueuedAt, "enqueued_at");
  j.not_before = r.req_int(kNotBefore, "not_before");
  j.started_at = r.opt_int(kStartedAt, "started_at");
  j.first_token_at = r.opt_int(kFirstTokenAt, "first_token_at");
  j.finished_at = r.opt_int(kFinishedAt, "finished_at");
  if (j.state == JobState::Done) {
    JobResult res;
    res.text = r.opt_own_text(kResultText, "result_text").value_or("");
    res.prompt_tokens = r.opt_int(kPromptTokens, "prompt_tokens").value_or(0);
    res.completion_tokens = r.opt_int(kCompletionTokens, "completion_tokens").value_or(0);
    res.finish_reason = r.opt_own_text(kFinishReason, "finish_reason").value_or("stop");
    res.first_token_at = j.first_token_at;
    j.result = std::move(res);
  }
  row.error = std::move(r.error);
  return row;
}

std::optional<std::string> claim_problem(const JobRow& row, const JobLimits& limits) {
  if (row.error) return row.error;
  if (auto e = find_job_spec_error(row.job.spec, limits)) return e;
  if (row.job.attempts >= row.job.spec.max_attempts) {
    return "attempts: " + std::to_string(row.job.attempts) + " already reaches max_attempts " +
           std::to_string(row.job.spec.max_attempts);
  }
  return std::nullopt;
}

std::optional<std::string> stop_list_to_json(const std::vector<std::string>& stop) {
  if (stop.empty()) return std::nullopt;
  return nlohmann::json(stop).dump();
}

}  // namespace moebatch
