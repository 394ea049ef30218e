#include "queue/zmq/store_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "queue/batch_export.h"
#include "queue/job_json.h"

namespace moebatch::zmq_ingress {
namespace {

using nlohmann::json;

// Requests taken from the queue per wake-up; bounds the latency of the first one in the group.
constexpr size_t kMaxItemsPerRound = 256;

/// Any exception of a store call as a reply: lock contention past busy_timeout is "busy", the
/// rest "internal" (a store error, or out of memory or a bug, which fails this request only,
/// never the worker thread); both are retryable because nothing was committed.
ProtocolError store_error(const std::exception& e) {
  const std::string what = e.what();
  const bool locked =
      what.find("locked") != std::string::npos || what.find("busy") != std::string::npos;
  return ProtocolError{
      std::string(locked ? error_code::kBusy : error_code::kInternal),
      locked ? "the job store is busy; retry later" : std::string("job store error: ") + what,
      std::nullopt, true};
}

}  // namespace

StoreWorker::StoreWorker(zmq::context_t& ctx, const std::string& reply_endpoint,
                         std::unique_ptr<JobStore> store, StoreWorkerOptions options,
                         IngressCounters& counters)
    : store_(std::move(store)),
      options_(std::move(options)),
      counters_(counters),
      replies_(ctx, zmq::socket_type::push) {
  // Replies are bounded by the queue capacity already; an HWM here could only block the
  // store thread on a reply the socket thread is about to read.
  replies_.set(zmq::sockopt::sndhwm, 0);
  replies_.set(zmq::sockopt::linger, 0);
  replies_.connect(reply_endpoint);
  thread_ = std::thread([this] { run(); });
}

StoreWorker::~StoreWorker() {
  close();
  join();
}

bool StoreWorker::try_push(RoutedRequest& item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || queue_.size() >= options_.capacity) return false;
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
  return true;
}

void StoreWorker::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_one();
}

void StoreWorker::join() {
  if (thread_.joinable()) thread_.join();
}

void StoreWorker::run() {
  std::vector<RoutedRequest> items;
  for (;;) {
    items.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (queue_.empty()) break;  // closed and drained
      while (!queue_.empty() && items.size() < kMaxItemsPerRound) {
        items.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    process(items);
  }
  replies_.send(zmq::message_t(), zmq::send_flags::none);  // end marker
  replies_.close();
  store_.reset();
}

void StoreWorker::process(std::vector<RoutedRequest>& items) {
  size_t i = 0;
  while (i < items.size()) {
    if (items[i].request.cmd != Command::Submit) {
      answer_one(items[i]);
      ++i;
      continue;
    }
    size_t end = i, jobs = 0;
    while (end < items.size() && items[end].request.cmd == Command::Submit &&
           (end == i || jobs + items[end].request.jobs.size() <= options_.max_jobs_per_commit)) {
      jobs += items[end].request.jobs.size();
      ++end;
    }
    commit_submits(items, i, end);
    i = end;
  }
}

void StoreWorker::crash_if(CrashPoint point) {
  if (options_.crash_point == point) {
    spdlog::critical("test crash hook: exiting at {}",
                     point == CrashPoint::BeforeCommit ? "before-commit" : "after-commit");
    std::_Exit(86);
  }
}

void StoreWorker::commit_submits(std::vector<RoutedRequest>& items, size_t begin, size_t end) {
  std::vector<JobSpec> specs;
  for (size_t k = begin; k < end; ++k) {
    for (JobSpec& s : items[k].request.jobs) specs.push_back(std::move(s));
  }
  std::vector<SubmitResult> results;
  try {
    crash_if(CrashPoint::BeforeCommit);
    results = store_->submit_many(specs);
  } catch (const KeyConflictError& e) {
    if (end - begin > 1) {
      // One producer's reused key must not fail the requests grouped with it: give the specs
      // back (submit_many left them intact) and commit each request on its own.
      size_t offset = 0;
      for (size_t k = begin; k < end; ++k) {
        for (JobSpec& s : items[k].request.jobs) s = std::move(specs[offset++]);
      }
      for (size_t k = begin; k < end; ++k) commit_submits(items, k, k + 1);
      return;
    }
    const Request& r = items[begin].request;
    const std::string field =
        (r.single_job ? std::string("job") : "jobs[" + std::to_string(e.index()) + "]") + ".key";
    reply_error(items[begin],
                ProtocolError{std::string(error_code::kKeyConflict),
                              field + ": '" + e.key() + "' already names job " +
                                  std::to_string(e.existing_id()) + " with a different payload",
                              field, false});
    return;
  } catch (const InputError& e) {
    // The socket thread validated every job with the store's own limits, so this means the two
    // disagree; answer each request alone so one bad message cannot fail its neighbours.
    spdlog::error("ingress: store rejected a pre-validated group: {}", e.what());
    for (size_t k = begin; k < end; ++k) {
      reply_error(items[k],
                  ProtocolError{std::string(error_code::kInvalid), e.what(), std::nullopt, false});
    }
    return;
  } catch (const std::exception& e) {
    const ProtocolError err = store_error(e);
    spdlog::warn("ingress: submit of {} job(s) not committed: {}", specs.size(), e.what());
    for (size_t k = begin; k < end; ++k) reply_error(items[k], err);
    return;
  }
  crash_if(CrashPoint::AfterCommit);
  // Counters first, so a producer that reads stats right after its ack sees its own jobs.
  size_t created = 0;
  for (const SubmitResult& r : results) created += r.created ? 1 : 0;
  counters_.commits.fetch_add(1);
  counters_.jobs_created.fetch_add(created);
  counters_.jobs_existing.fetch_add(specs.size() - created);
  if (options_.on_committed && created > 0) options_.on_committed(created);
  size_t offset = 0;
  for (size_t k = begin; k < end; ++k) {
    json out = json::array();
    const size_t n = items[k].request.jobs.size();
    for (size_t j = 0; j < n; ++j) {
      out.push_back({{"id", results[offset + j].id}, {"created", results[offset + j].created}});
    }
    offset += n;
    reply(items[k], ok_reply(items[k].request.id, {{"jobs", std::move(out)}}));
  }
}

void StoreWorker::answer_one(RoutedRequest& item) {
  const Request& r = item.request;
  try {
    if (r.cmd == Command::Stats) {
      const auto c = [](const std::atomic<uint64_t>& v) { return v.load(); };
      json ingress = {{"requests", c(counters_.requests)},
                      {"jobs_created", c(counters_.jobs_created)},
                      {"jobs_existing", c(counters_.jobs_existing)},
                      {"commits", c(counters_.commits)},
                      {"errors", c(counters_.errors)},
                      {"busy", c(counters_.busy)},
                      {"undeliverable", c(counters_.undeliverable)},
                      {"notices", c(counters_.notices)},
                      {"notices_refused", c(counters_.notices_refused)}};
      reply(item, ok_reply(r.id, {{"queue", queue_stats()}, {"ingress", std::move(ingress)}}));
      return;
    }
    if (r.cmd == Command::BatchStatus || r.cmd == Command::BatchCancel ||
        r.cmd == Command::BatchRetry || r.cmd == Command::BatchPurge ||
        r.cmd == Command::BatchResults) {
      answer_batch(item);
      return;
    }
    std::optional<Job> job = r.job_id ? store_->get(*r.job_id) : store_->get_by_key(*r.client_key);
    if (!job) {
      const bool by_id = r.job_id.has_value();
      reply_error(item, ProtocolError{std::string(error_code::kNotFound),
                                      by_id ? "no job with id " + std::to_string(*r.job_id)
                                            : "no job with key '" + *r.client_key + "'",
                                      by_id ? "job_id" : "key", false});
      return;
    }
    if (r.cmd == Command::Status) {
      reply(item, ok_reply(r.id, {{"job", job_status_json(*job)}}));
    } else if (r.cmd == Command::Result) {
      json res = nullptr;
      if (job->result) {
        res = {{"text", job->result->text},
               {"prompt_tokens", job->result->prompt_tokens},
               {"completion_tokens", job->result->completion_tokens},
               {"finish_reason", job->result->finish_reason}};
      }
      reply(item, ok_reply(r.id, {{"job", job_status_json(*job)}, {"result", std::move(res)}}));
    } else {
      const bool cancelled = store_->cancel(job->id);
      std::optional<Job> after = store_->get(job->id);
      reply(item, ok_reply(r.id, {{"cancelled", cancelled},
                                  {"job", job_status_json(after ? *after : *job)}}));
    }
  } catch (const std::exception& e) {
    reply_error(item, store_error(e));
  }
}

// The queue part of a stats reply: the kept snapshot while it is fresh, else a new one. age_ms
// says how old the counts are.
json StoreWorker::queue_stats() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point now = Clock::now();
  if (stats_json_.is_null() || now >= stats_fresh_until_) {
    stats_json_ = stats_to_json(store_->stats());
    const Clock::time_point read = Clock::now();
    const auto keep = options_.stats_max_age.count() <= 0
                          ? Clock::duration::zero()
                          : std::max<Clock::duration>(options_.stats_max_age, 10 * (read - now));
    stats_read_at_ = now;
    stats_fresh_until_ = read + keep;
    now = read;
  }
  json out = stats_json_;
  out["age_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - stats_read_at_).count();
  return out;
}

// The batch verbs: one store call each (batch_results: one page of the export), then the batch's
// counts as they stand after it. A batch id without jobs is not an error here (its counts are
// zero), as for the CLI.
void StoreWorker::answer_batch(const RoutedRequest& item) {
  const Request& r = item.request;
  json body = json::object();
  if (r.cmd == Command::BatchCancel) {
    body["jobs_cancelled"] = store_->cancel_batch(r.batch_id);
  } else if (r.cmd == Command::BatchRetry) {
    body["jobs_requeued"] = store_->retry_batch(r.batch_id);
  } else if (r.cmd == Command::BatchPurge) {
    const PurgeOutcome p = store_->purge_batch(r.batch_id);
    body["jobs_deleted"] = p.deleted;
    body["jobs_unfinished"] = p.unfinished;
  } else if (r.cmd == Command::BatchResults) {
    body["results"] = batch_export_page_to_json(
        batch_export_page(*store_, r.batch_id, r.after_id, r.limit, kResultsPageBytes));
  }
  body["batch"] = batch_counts_to_json(r.batch_id, store_->batch_counts(r.batch_id));
  reply(item, ok_reply(r.id, std::move(body)));
}

void StoreWorker::reply(const RoutedRequest& item, const std::string& body) {
  for (const std::string& frame : item.envelope) {
    replies_.send(zmq::buffer(frame), zmq::send_flags::sndmore);
  }
  replies_.send(zmq::buffer(body), zmq::send_flags::none);
}

void StoreWorker::reply_error(const RoutedRequest& item, const ProtocolError& err) {
  counters_.errors.fetch_add(1);
  if (err.code == error_code::kBusy) counters_.busy.fetch_add(1);
  reply(item, error_reply(item.request.id, err));
}

}  // namespace moebatch::zmq_ingress
