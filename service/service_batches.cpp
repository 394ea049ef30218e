// The OpenAI Files and Batch API (docs/openai_api.md): upload a JSONL file of requests, create a
// batch from it, poll it, download its output and error files. A batch's requests become
// ordinary jobs of the durable queue (batch_id = the batch's id, client_key =
// "<batch>/<custom_id>", default priority, so interactive requests go first); the batch row and
// the files live beside them (queue/batch_store.h). Progress is the jobs' states; when none is
// left queued or running, the output and error files are written and the batch completes, in
// one transaction. A restart redoes only what was not committed: a batch still validating is
// submitted again with the same keys (no duplicate jobs), finished jobs stay finished.
#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/json_parse.h"
#include "common/utf8.h"
#include "queue/batch_export.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "queue/job_validate.h"
#include "queue/openai_batch.h"
#include "service/batch_create.h"
#include "service/engine_worker.h"
#include "service/multipart.h"
#include "service/openai_api.h"
#include "service/service.h"

namespace moebatch {
namespace {

using nlohmann::json;

constexpr int64_t kBatchTickMs = 500;        // how often open batches are checked
constexpr size_t kMaxBatchErrors = 50;       // errors reported for a bad input file
constexpr size_t kMaxBatchRequests = 50000;  // requests in one batch
constexpr int64_t kWindowS = 24 * 3600;      // the one completion window: "24h"

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

HttpReply json_reply(const json& j, int status = 200) {
  return {status, "application/json", dump_json(j) + "\n"};
}

// One entry of a batch's errors list.
json batch_error(const std::string& code, const std::string& message,
                 std::optional<size_t> line = std::nullopt) {
  return {{"code", code},
          {"message", message},
          {"param", nullptr},
          {"line", line ? json(*line) : json(nullptr)}};
}

HttpReply bad_request(const std::string& message, const std::string& param = "") {
  return json_error(400, message, "invalid_request_error", param);
}

HttpReply not_found(const std::string& what, const std::string& id) {
  return json_error(404, "No such " + what + ": '" + id + "'", "invalid_request_error", "id",
                    "not_found");
}

json opt(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }
json opt(const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); }

json file_json(const StoredFile& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"},
          {"expires_at", nullptr},
          {"status_details", nullptr}};
}

// Stored by batches_create from a checked request; a row that does not parse shows none.
json batch_metadata_json(const std::optional<std::string>& stored) {
  if (!stored) return nullptr;
  json m = parse_json_bounded(*stored);
  return m.is_discarded() ? json(nullptr) : m;
}

json batch_json(const BatchRecord& b, const BatchCounts& counts) {
  auto count = [&](JobState s) { return counts.counts.at(s); };
  json errors = nullptr;
  if (b.errors) errors = {{"object", "list"}, {"data", json::parse(*b.errors, nullptr, false)}};
  return {{"id", b.id},
          {"object", "batch"},
          {"endpoint", b.endpoint},
          {"errors", errors},
          {"input_file_id", b.input_file_id},
          {"completion_window", b.completion_window},
          {"status", b.status},
          {"output_file_id", opt(b.output_file_id)},
          {"error_file_id", opt(b.error_file_id)},
          {"created_at", b.created_at},
          {"in_progress_at", opt(b.in_progress_at)},
          {"expires_at", opt(b.expires_at)},
          {"finalizing_at", opt(b.finalizing_at)},
          {"completed_at", opt(b.completed_at)},
          {"failed_at", opt(b.failed_at)},
          {"expired_at", nullptr},
          {"cancelling_at", opt(b.cancelling_at)},
          {"cancelled_at", opt(b.cancelled_at)},
          {"request_counts",
           {{"total", b.total},
            {"completed", count(JobState::Done)},
            {"failed", count(JobState::Failed) + count(JobState::Cancelled)}}},
          {"metadata", batch_metadata_json(b.metadata)}};
}

// "a=1&b=x" → value of `key`, or nullopt (no percent-decoding: ids and numbers only).
std::optional<std::string> query_param(const std::string& query, const std::string& key) {
  size_t p = 0;
  while (p <= query.size()) {
    const size_t amp = std::min(query.find('&', p), query.size());
    const std::string kv = query.substr(p, amp - p);
    const size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key) return eq == std::string::npos ? "" : kv.substr(eq + 1);
    p = amp + 1;
  }
  return std::nullopt;
}

// Parses ?limit= (1..100, default 20) into `limit`; false (answered 400) when it is bad.
bool list_limit(const std::shared_ptr<HttpExchange>& ex, int64_t& limit) {
  limit = 20;
  auto l = query_param(ex->request().query, "limit");
  if (!l) return true;
  try {
    size_t used = 0;
    limit = std::stoll(*l, &used);
    if (used != l->size()) limit = 0;
  } catch (const std::exception&) {
    limit = 0;
  }
  if (limit >= 1 && limit <= 100) return true;
  ex->reply(bad_request("limit: must be an integer in [1, 100]", "limit"));
  return false;
}

}  // namespace

void Service::files_upload(const std::shared_ptr<HttpExchange>& ex) {
  if (store_refuses(ex)) return;
  const HttpRequest& req = ex->request();
  auto parsed = parse_multipart(req.header("content-type"), req.body);
  if (auto* e = std::get_if<std::string>(&parsed)) {
    ex->reply(bad_request("multipart body: " + *e));
    return;
  }
  const MultipartPart* file = nullptr;
  std::string purpose;
  for (const MultipartPart& p : std::get<std::vector<MultipartPart>>(parsed)) {
    if (p.name == "file") file = &p;
    if (p.name == "purpose") purpose = p.body;
  }
  if (purpose != "batch") {
    ex->reply(bad_request(
        "purpose: only 'batch' is supported, got '" + utf8_prefix(purpose, 64) + "'", "purpose"));
    return;
  }
  if (!file || file->body.empty()) {
    ex->reply(bad_request("file: missing or empty", "file"));
    return;
  }
  if (!is_valid_utf8(file->body)) {
    ex->reply(bad_request("file: not valid UTF-8 (a batch file is JSONL)", "file"));
    return;
  }
  const std::string name =
      file->filename.empty() ? "upload.jsonl" : utf8_prefix(file->filename, 256);
  StoredFile stored;
  try {
    stored = batches_->add_file("batch", name, file->body, now_s());
  } catch (const InputError& e) {
    // What the store cannot hold (PostgreSQL text: a NUL byte), named by the store: the
    // client's to fix, so not a 500, which the SDKs would retry.
    ex->reply(bad_request(e.what(), "file"));
    return;
  }
  ex->reply(json_reply(file_json(stored)));
}

void Service::files_list(const std::shared_ptr<HttpExchange>& ex) {
  int64_t limit = 0;
  if (!list_limit(ex, limit)) return;
  bool has_more = false;
  const std::string& q = ex->request().query;
  const auto files =
      batches_->list_files(query_param(q, "after"), limit, query_param(q, "purpose"), has_more);
  json data = json::array();
  for (const StoredFile& f : files) data.push_back(file_json(f));
  ex->reply(json_reply({{"object", "list"},
                        {"data", data},
                        {"first_id", files.empty() ? json(nullptr) : json(files.front().id)},
                        {"last_id", files.empty() ? json(nullptr) : json(files.back().id)},
                        {"has_more", has_more}}));
}

void Service::files_get(const std::shared_ptr<HttpExchange>& ex) {
  const std::string& id = ex->request().params.at(0);
  if (auto f = batches_->file(id)) {
    ex->reply(json_reply(file_json(*f)));
  } else {
    ex->reply(not_found("file", id));
  }
}

// A file's content, sent one stored piece (kFileChunkBytes) at a time, each read once the last
// has gone to the socket: a download holds one piece in memory and takes one short read of the
// io thread at a time, whatever the file's size or the client's pace.
void Service::files_content(const std::shared_ptr<HttpExchange>& ex) {
  const std::string& id = ex->request().params.at(0);
  const std::optional<StoredFile> f = batches_->file(id);
  // The first piece is read before the header goes, so that a file deleted meanwhile is a 404
  // and a store error a 500, not a cut 200.
  std::optional<std::string> first;
  if (f && f->bytes > 0 && !ex->request().head) first = batches_->file_chunk(id, 0);
  if (!f || (f->bytes > 0 && !ex->request().head && !first)) {
    ex->reply(not_found("file", id));
    return;
  }
  ex->begin_body(200, "application/octet-stream", static_cast<uint64_t>(f->bytes));
  if (ex->request().head) {
    ex->end_stream();
    return;
  }
  send_file_piece(ex, id, 0, f->bytes, std::move(first));
}

void Service::send_file_piece(const std::weak_ptr<HttpExchange>& weak, const std::string& id,
                              int64_t seq, int64_t left, std::optional<std::string> piece) {
  const auto ex = weak.lock();
  if (!ex || ex->done()) return;  // the client went away
  if (left == 0) {
    ex->end_stream();
    return;
  }
  // Past the header nothing but a cut connection tells the client that the body failed.
  if (!piece) {
    try {
      piece = batches_->file_chunk(id, seq);
    } catch (const std::exception& e) {
      spdlog::warn("file {}: reading piece {} failed ({}); the download is cut short", id, seq,
                   e.what());
      ex->abort();
      return;
    }
  }
  if (!piece || piece->empty() || static_cast<int64_t>(piece->size()) > left) {
    if (piece && !piece->empty()) {
      spdlog::warn("file {}: its stored pieces hold more than its size; the download is cut short",
                   id);
    } else {
      spdlog::warn("file {}: piece {} is missing with {} bytes still to send (deleted while "
                   "downloaded?); the download is cut short",
                   id, seq, left);
    }
    ex->abort();
    return;
  }
  left -= static_cast<int64_t>(piece->size());
  ex->write(std::move(*piece));
  if (left == 0) {
    ex->end_stream();
    return;
  }
  ex->when_drained([this, weak, id, seq, left] {
    send_file_piece(weak, id, seq + 1, left, std::nullopt);
  });
}

void Service::files_delete(const std::shared_ptr<HttpExchange>& ex) {
  if (store_refuses(ex)) return;
  const std::string& id = ex->request().params.at(0);
  if (batches_->delete_file(id)) {
    ex->reply(json_reply({{"id", id}, {"object", "file"}, {"deleted", true}}));
  } else {
    ex->reply(not_found("file", id));
  }
}

void Service::batches_create(const std::shared_ptr<HttpExchange>& ex) {
  if (store_refuses(ex)) return;
  if (stopping_ || done_) {
    ex->reply(json_error(503, "the server is shutting down", "server_error", {}, "shutting_down"));
    return;
  }
  // Strict, as every door of the queue: duplicate keys and nesting past kMaxJsonDepth refused.
  auto parsed = parse_batch_create(ex->request().body);
  if (const auto* e = std::get_if<BatchCreateError>(&parsed)) {
    ex->reply(json_error(400, e->message, "invalid_request_error", e->param, e->code));
    return;
  }
  BatchRecord b = std::move(std::get<BatchRecord>(parsed));
  const auto file = batches_->file(b.input_file_id);
  if (!file) {
    ex->reply(not_found("file", b.input_file_id));
    return;
  }
  if (file->purpose != "batch") {
    ex->reply(bad_request("input_file_id: the file's purpose is not 'batch'", "input_file_id"));
    return;
  }
  b.created_at = now_s();
  b.expires_at = b.created_at + kWindowS;
  b = batches_->add_batch(std::move(b));
  batch_validate(b);
  const auto stored = batches_->batch(b.id);
  ex->reply(json_reply(batch_json(*stored, store_->batch_counts(b.id))));
}

// Reads the input file; every line must be a request to the batch's endpoint with a unique
// custom_id. All good: the jobs are queued in one transaction (idempotent by key, so a rerun
// after a crash queues nothing twice) and the batch is in progress. Otherwise (bad lines, or
// requests the store refuses) it failed, with the errors, and nothing was queued.
void Service::batch_validate(const BatchRecord& b) {
  json errors = json::array();
  std::vector<JobSpec> specs;
  const auto content = batches_->file_content(b.input_file_id);
  if (!content) {
    errors.push_back({{"code", "file_not_found"},
                      {"message", "the input file was deleted"},
                      {"param", "input_file_id"},
                      {"line", nullptr}});
  } else {
    const JobLimits& limits = store_->options().limits;
    const BatchFileLimits file_limits;
    std::set<std::string> custom_ids;
    size_t p = 0, line_no = 0;
    while (p < content->size() && errors.size() < kMaxBatchErrors) {
      const size_t e = std::min(content->find('\n', p), content->size());
      std::string line = content->substr(p, e - p);
      p = e + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      auto fail = [&](const std::string& msg) {
        errors.push_back(batch_error("invalid_request", msg, line_no));
      };
      if (line.size() > file_limits.max_line_bytes) {
        fail("line " + std::to_string(line_no) + ": longer than 4 MiB");
        continue;
      }
      try {
        JobSpec spec = parse_batch_line(line, line_no, b.id, limits);
        const bool chat = spec.prompt_kind == PromptKind::Chat;
        if (chat != (b.endpoint == "/v1/chat/completions")) {
          fail("line " + std::to_string(line_no) + ": url: must be the batch's endpoint " +
               b.endpoint);
        } else if (!custom_ids.insert(*spec.custom_id).second) {
          fail("line " + std::to_string(line_no) + ": custom_id: '" + *spec.custom_id +
               "' repeats an earlier line");
        } else if (specs.size() >= kMaxBatchRequests) {
          fail("the file holds more than " + std::to_string(kMaxBatchRequests) + " requests");
        } else {
          specs.push_back(std::move(spec));
        }
      } catch (const InputError& ex) {
        fail(ex.what());
      }
    }
    if (errors.empty() && specs.empty()) {
      errors.push_back(batch_error("empty_file", "the input file holds no requests"));
    }
  }
  if (errors.empty()) {
    try {
      store_->submit_many(specs);
    } catch (const InputError& e) {
      // Lines the parser took but the store refuses (PostgreSQL text cannot hold a NUL byte; a
      // key already naming another request): the batch fails as for a bad line. "#n" counts the
      // requests from 0, blank lines left out.
      errors.push_back(
          batch_error("invalid_request", std::string("the requests were not queued: ") + e.what()));
    }
  }
  const int64_t now = now_s();
  if (!errors.empty()) {
    batches_->transition(b.id, "validating", "failed", now, std::nullopt, dump_json(errors));
    spdlog::info("batch {}: failed validation ({} errors)", b.id, errors.size());
    return;
  }
  batches_->transition(b.id, "validating", "in_progress", now, static_cast<int64_t>(specs.size()));
  spdlog::info("batch {}: {} requests queued", b.id, specs.size());
  claim_now_ = true;  // our own commit does not move data_version
}

void Service::batches_get(const std::shared_ptr<HttpExchange>& ex) {
  const std::string& id = ex->request().params.at(0);
  if (auto b = batches_->batch(id)) {
    ex->reply(json_reply(batch_json(*b, store_->batch_counts(id))));
  } else {
    ex->reply(not_found("batch", id));
  }
}

void Service::batches_list(const std::shared_ptr<HttpExchange>& ex) {
  const std::string& q = ex->request().query;
  int64_t limit = 0;
  if (!list_limit(ex, limit)) return;
  bool has_more = false;
  const auto batches = batches_->list_batches(query_param(q, "after"), limit, has_more);
  json data = json::array();
  for (const BatchRecord& b : batches) data.push_back(batch_json(b, store_->batch_counts(b.id)));
  ex->reply(json_reply({{"object", "list"},
                        {"data", data},
                        {"first_id", batches.empty() ? json(nullptr) : json(batches.front().id)},
                        {"last_id", batches.empty() ? json(nullptr) : json(batches.back().id)},
                        {"has_more", has_more}}));
}

void Service::batches_cancel(const std::shared_ptr<HttpExchange>& ex) {
  if (store_refuses(ex)) return;
  const std::string& id = ex->request().params.at(0);
  auto b = batches_->batch(id);
  if (!b) {
    ex->reply(not_found("batch", id));
    return;
  }
  if (b->status != "in_progress" && b->status != "cancelling") {
    ex->reply(bad_request("cannot cancel a batch that is " + b->status));
    return;
  }
  batches_->transition(id, "in_progress", "cancelling", now_s());
  // Every unfinished request is cancelled, in one transaction: should it fail, none is, and the
  // client's retry (a cancelling batch may be cancelled again) cancels them all. Finished ones
  // keep their results for the output.
  const int64_t cancelled = store_->cancel_batch(id);
  stop_lost_jobs();  // ours are cancels from this connection: data_version will not tell
  spdlog::info("batch {}: cancelling ({} requests cancelled)", id, cancelled);
  batches_tick(/*force=*/true);
  ex->reply(json_reply(batch_json(*batches_->batch(id), store_->batch_counts(id))));
}

// Open batches: a batch left validating by a crash is validated again; one whose jobs are all
// final gets its output and error files and completes (or is cancelled). Each batch is a step of
// its own: one that throws is logged once, by id, and never holds up the others.
void Service::batches_tick(bool force) {
  if (!batches_) return;
  const int64_t now = steady_now_ms();
  if (!force && now - last_batch_tick_ms_ < kBatchTickMs) return;
  last_batch_tick_ms_ = now;
  // The batch's own content made a step throw (something the checks missed): it would throw
  // again at every tick, so it fails with the reason.
  auto broken = [&](const BatchRecord& b, const std::string& why) {
    if (batches_in_trouble_.insert(b.id).second)
      spdlog::error("batch {} ({}): {}; the batch fails", b.id, b.status, why);
    try {
      batches_->transition(b.id, b.status, "failed", now_s(), std::nullopt,
                           dump_json(json::array({batch_error("batch_failed", why)})));
    } catch (const std::exception&) {
      // The store refused that too: the next tick tries again, without a new log line.
    }
  };
  std::vector<BatchRecord> batches;
  if (!store_read("listing open batches", [&] {
        batches = batches_->batches_with_status({"validating", "in_progress", "cancelling"});
      }))
    return;
  std::set<std::string> open;
  for (const BatchRecord& b : batches) {
    open.insert(b.id);
    try {
      if (b.status == "validating") {
        batch_validate(b);
      } else if (store_->batch_counts(b.id).unfinished() == 0) {
        batch_finalize(b);
      }
      batches_in_trouble_.erase(b.id);
    } catch (const InputError& e) {
      broken(b, e.what());
    } catch (const Error& e) {
      // The store (a held lock, a lost connection), not the batch: the next tick tries again.
      if (batches_in_trouble_.insert(b.id).second)
        spdlog::warn("batch {} ({}): {}; trying again", b.id, b.status, e.what());
    } catch (const std::exception& e) {
      broken(b, e.what());
    }
  }
  std::erase_if(batches_in_trouble_, [&](const std::string& id) { return !open.contains(id); });
}

void Service::batch_finalize(const BatchRecord& b) {
  // Over the bound: InputError, and batches_tick fails the batch with the reason.
  const BatchFiles files =
      batch_files(*store_, b.id, static_cast<size_t>(cfg_.batch_output_max_mb) << 20);
  const std::string to = b.status == "cancelling" ? "cancelled" : "completed";
  if (batches_->finish(b.id, b.status, to, files.output, files.errors, now_s()))
    spdlog::info("batch {}: {}", b.id, to);
}

}  // namespace moebatch
