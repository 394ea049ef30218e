// The io thread's data path: intake (data_version polling, claims, tokenization and
// validation), results (grouped completion transactions), lease renewal, and the periodic
// checks (schedule, operator requests, engine state). Every handler catches what the store
// throws: a transient database error is logged and retried at the next tick, never fatal.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "common/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "queue/job_store.h"
#include "service/api_call.h"
#include "service/engine_worker.h"
#include "service/openai_api.h"
#include "service/service.h"
#include "service/service_db.h"

namespace moebatch {
namespace {

// Even with no commit from elsewhere, claim this often: retry backoffs (not_before) and expired
// leases of dead workers become claimable with the passage of time alone.
constexpr int64_t kForcedClaimMs = 1000;

}  // namespace

void Service::arm_poll() {
  if (done_) return;
  poll_timer_.expires_after(std::chrono::milliseconds(cfg_.poll_ms));
  poll_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // operation_aborted at exit
    poll();
    arm_poll();
  });
}

void Service::poll() {
  guarded("results", [this] { on_notify(); });
  if (done_) return;
  guarded("intake", [this] {
    check_schedule();
    flush_results();
    claim();
    publish_finals();
    prune_finals();
    api_resolve(/*force=*/false);
    if (!store_health_.failing()) batches_tick(/*force=*/false);
    check_batches();
  });
}

// Every io-thread handler runs its work through this: an exception leaving a handler would
// leave io_context::run and end the daemon, and a timer's handler that throws before re-arming
// would stop that timer for good. The work is retried by the next poll.
void Service::guarded(const char* what, const std::function<void()>& step) {
  try {
    step();
  } catch (const std::exception& e) {
    spdlog::error("{}: {} (retrying at the next poll)", what, e.what());
  }
}

// Everything the engine thread may have reported: results, the end of a maintenance cycle,
// its own death, the end of a stop.
void Service::on_notify() {
  if (done_) return;
  drain_results();
  if (maintenance_) finish_maintenance();
  if (worker_engine_->dead()) {
    on_engine_dead();
    return;
  }
  if (stopping_ && worker_engine_->finished()) {
    worker_engine_->join();
    drain_results();
    stop_tally_.not_started += release_handoff();
    if (!pending_.empty()) {
      // The store refuses writes: the poll timer keeps trying until the stop deadline.
      if (steady_now_ms() < give_up_results_ms_) return;
      spdlog::error(
          "stopping with {} result(s) the store did not take ({}); those jobs run again once "
          "their leases expire",
          pending_.size(), store_health_.last_error());
      pending_.clear();
    }
    log_stop_summary();
    finish_run(0);
  }
}

void Service::claim() {
  if (done_) return;
  int64_t version = 0;
  if (!store_read("reading the data version", [&] { version = store_->data_version(); })) return;
  const bool changed = version != last_data_version_;
  if (changed) {
    // Operator requests arrive as rows from another connection, so they move data_version too.
    // Taking one is a write (only when there is one, so a success here says nothing about the
    // store): when it is refused, the version is not marked seen and the request is looked at
    // again at the next poll.
    bool seen = true;
    try {
      if (auto req = service_db_->take_request("maintenance", worker_, hooks_.clock->now_ms())) {
        spdlog::info("maintenance requested (request {})", *req);
        start_maintenance("request");
      }
    } catch (const std::exception& e) {
      store_failed("taking an operator request", e.what());
      seen = false;
    }
    // A cancel is a commit from another connection too: stop the engine's work on it now. A
    // store that cannot say which leases are lost leaves the version unseen, to look again.
    seen = stop_lost_jobs() && seen;
    if (seen) last_data_version_ = version;
  }
  if (!admitting_) return;
  // Results first: no new work while finished work waits for the store. This is also what
  // bounds the results held in memory to the slots plus the hand-off.
  if (!pending_.empty()) return;
  const int64_t now = steady_now_ms();
  if (!changed && !claim_now_ && now - last_forced_claim_ms_ < kForcedClaimMs) return;
  // Room: every engine slot plus the hand-off, so a freed slot is refilled at the next step
  // from jobs already tokenized; never more, so no job waits leased behind a full queue.
  Handoff<WorkItem>& handoff = worker_engine_->input();
  const int64_t by_slots = cfg_.max_num_seqs + static_cast<int64_t>(handoff.capacity()) -
                           static_cast<int64_t>(in_flight_.size());
  const int64_t by_handoff = static_cast<int64_t>(handoff.capacity() - handoff.size());
  const int64_t room = std::min(by_slots, by_handoff);
  if (room <= 0) return;
  std::vector<Job> jobs;
  if (!store_write("claiming jobs", [&] {
        jobs = store_->claim(worker_, room, std::chrono::seconds(cfg_.lease_s));
      }))
    return;  // claim_now_ stays set: tried again after the backoff
  last_forced_claim_ms_ = now;
  claim_now_ = false;
  std::vector<int64_t> unplaced;
  for (const Job& job : jobs) {
    // Our lease on it expired and we took the job again before noticing: the old claim's work
    // (if any is still in flight) is stale.
    give_up_claims({job.id});
    // A streaming API response that already sent text cannot restart with this run.
    if (!api_run_starts(job.id, {503, "this response's job was taken over while streaming", "",
                                 "lease_lost", "server_error"}))
      continue;
    auto prepared = prepare_work(job, *tokenizer_, limits_);
    if (auto* reason = std::get_if<std::string>(&prepared)) {
      // A bad job fails alone, for good: retrying cannot fix its input.
      spdlog::info("job {} failed: {}", job.id, *reason);
      PendingResult p;
      p.job_id = job.id;
      p.outcome = WorkOutcome::Rejected;
      p.error = *reason;
      p.param = reason->substr(0, reason->find(':'));
      p.batch_id = job.spec.batch_id;
      pending_.push_back(std::move(p));
      continue;
    }
    InFlightJob f;
    f.ticket = ++last_ticket_;
    f.enqueued_at = job.enqueued_at;
    f.started_at = job.started_at.value_or(hooks_.clock->now_ms());
    f.stop = job.spec.sampling.stop;
    f.client_key = job.spec.client_key;
    f.batch_id = job.spec.batch_id;
    in_flight_[job.id] = std::move(f);
    WorkItem& item = std::get<WorkItem>(prepared);
    item.ticket = last_ticket_;
    item.stream = api_streaming(job.id);
    // Higher priority (API requests) overtakes batch work claimed earlier.
    const bool placed = handoff.try_push_ordered(
        std::move(item),
        [](const WorkItem& a, const WorkItem& b) { return a.priority > b.priority; });
    if (!placed) unplaced.push_back(job.id);
  }
  if (!unplaced.empty()) {
    // Only the engine thread pops, so free space cannot shrink: this is a broken invariant,
    // handled anyway by giving the jobs back.
    spdlog::warn("hand-off full: giving back {} jobs", unplaced.size());
    for (int64_t id : unplaced) in_flight_.erase(id);
    store_write("giving back jobs", [&] { store_->release(worker_, unplaced); });
  }
  flush_results();
  if (static_cast<int64_t>(jobs.size()) == room) claim_now_ = true;  // more may be waiting
}

void Service::drain_results() {
  std::vector<WorkProgress> progress;
  std::vector<WorkResult> results = worker_engine_->take_results(&progress);
  api_progress(progress);
  if (results.empty()) return;
  const bool dead = worker_engine_->dead();
  for (WorkResult& r : results) {
    auto it = in_flight_.find(r.job_id);
    if (it == in_flight_.end() || it->second.ticket != r.ticket) {
      // The claim it belongs to was given up (lease lost, job cancelled) while it finished.
      spdlog::info("job {}: result of a claim no longer held; ignored", r.job_id);
      continue;
    }
    const InFlightJob job = std::move(it->second);
    in_flight_.erase(it);
    PendingResult p;
    p.job_id = r.job_id;
    p.outcome = r.outcome;
    p.batch_id = job.batch_id;
    if (stopping_ && !dead) {
      if (r.outcome == WorkOutcome::Finished) ++stop_tally_.finished;
      if (r.outcome == WorkOutcome::Aborted) ++stop_tally_.interrupted;
    }
    switch (r.outcome) {
      case WorkOutcome::Finished:
        try {
          p.completion = make_completion(r, job, *tokenizer_);
        } catch (const std::exception& e) {
          spdlog::error("job {}: result not recorded: {} (it runs again when its lease ends)",
                        r.job_id, e.what());
          continue;
        }
        break;
      case WorkOutcome::Rejected:
        p.error = "engine: " + r.error;
        break;
      case WorkOutcome::Aborted:
        // Counted as an attempt when the engine died: a job that kills the engine every time
        // must end failed. Otherwise (drain deadline) it is given back as if never started.
        p.error = r.error;
        p.count_attempt = dead;
        break;
    }
    pending_.push_back(std::move(p));
  }
  claim_now_ = true;
  flush_results();
}

// Writes the pending results: give-backs, then failures one by one, then the completions in
// one transaction (result rows and latency records together). A write the store refuses keeps
// what is left for the next try, after StoreHealth's backoff; what committed leaves the list
// at once, so a retry never repeats it (a repeated retryable failure would count an attempt
// twice). API replies go out after the store has the result.
bool Service::flush_results() {
  if (pending_.empty()) return true;
  std::vector<std::function<void()>> replies;
  const bool ok = store_write("writing results", [&] {
    std::vector<int64_t> released;
    for (const PendingResult& p : pending_)
      if (p.outcome == WorkOutcome::Aborted && !p.count_attempt) released.push_back(p.job_id);
    if (!released.empty()) {
      metrics_.jobs_requeued(store_->release(worker_, released));
      std::erase_if(pending_, [](const PendingResult& p) {
        return p.outcome == WorkOutcome::Aborted && !p.count_attempt;
      });
      for (int64_t id : released) {
        replies.emplace_back([this, id] {
          api_run_starts(id, {503, "the engine restarted while this response was streaming", "",
                              "engine_restarting", "server_error"});
        });
      }
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->outcome == WorkOutcome::Finished) {
        ++it;
        continue;
      }
      const int64_t id = it->job_id;
      const std::string error = it->error;
      if (it->outcome == WorkOutcome::Rejected) {
        store_->fail(worker_, id, error, /*retryable=*/false);
        metrics_.job_failed();
        note_batch(it->batch_id, /*done=*/false);
        const std::string param = it->param;
        replies.emplace_back([this, id, error, param] {
          api_failed(id, param.empty() ? invalid_request(error) : invalid_request(error, param));
        });
      } else {
        store_->fail(worker_, id, error, /*retryable=*/true);
        metrics_.jobs_requeued(1);
        replies.emplace_back([this, id, error] {
          api_failed(id, {503, "the engine failed: " + error, "", "engine_failed", "server_error"});
        });
      }
      it = pending_.erase(it);
    }
    if (pending_.empty()) return;
    std::vector<Completion> completions;
    for (const PendingResult& p : pending_) completions.push_back(p.completion);
    const std::vector<bool> landed = store_->complete_many(worker_, completions);
    for (size_t i = 0; i < completions.size(); ++i)
      if (landed[i]) note_batch(pending_[i].batch_id, /*done=*/true);
    pending_.clear();
    for (size_t i = 0; i < completions.size(); ++i) {
      const Completion& c = completions[i];
      if (!landed[i]) {
        spdlog::warn("job {}: result not recorded (lease lost or job cancelled)", c.id);
        continue;
      }
      metrics_.job_done(c.latency.queue_wait_ms / 1000.0, c.latency.ttft_ms.value_or(0) / 1000.0,
                        c.latency.total_ms / 1000.0, c.result.completion_tokens);
      replies.emplace_back([this, c] { api_finished(c); });
    }
  });
  for (auto& reply : replies) reply();
  if (ok) claim_now_ = true;
  publish_finals();
  return ok;
}

// One store write on the io thread: skipped while StoreHealth's backoff runs, its outcome
// recorded (store_failed logs a failure at most every 10 s). False when it did not commit.
bool Service::store_write(const char* what, const std::function<void()>& write) {
  if (!store_health_.may_try(steady_now_ms())) return false;
  const size_t pending = pending_.size();
  try {
    write();
  } catch (const std::exception& e) {
    store_failed(what, e.what());
    return false;
  }
  if (store_health_.failing()) {
    spdlog::info("store: writable again after {} failed writes ({} results were pending)",
                 store_health_.failures_in_a_row(), pending);
  }
  store_health_.write_ok();
  return true;
}

// A store read the io thread's loop depends on (the data version, lease checks, final events,
// API calls' jobs): false when it failed, logged at most every 10 s; the caller retries at a
// later poll. Reads are not held back by StoreHealth's write backoff: a store that refuses
// writes (a held lock, a full disk) usually still reads.
bool Service::store_read(const char* what, const std::function<void()>& read) {
  try {
    read();
    return true;
  } catch (const std::exception& e) {
    const int64_t now = steady_now_ms();
    if (last_read_warn_ms_ < 0 || now - last_read_warn_ms_ >= 10000) {
      last_read_warn_ms_ = now;
      spdlog::warn("store: {} failed: {} (retrying at the next poll)", what, e.what());
    }
    return false;
  }
}

bool Service::result_pending(int64_t job_id) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const PendingResult& p) { return p.job_id == job_id; });
}

void Service::store_failed(const char* what, const std::string& error) {
  const int64_t now = steady_now_ms();
  store_health_.write_failed(error, now);
  if (!store_health_.log_due(now)) return;
  spdlog::error("store: {} failed ({} failed writes in a row; results are kept{}): {}", what,
                store_health_.failures_in_a_row(),
                pending_.empty() ? "" : fmt::format(", {} pending", pending_.size()), error);
}

// Announces every final transition committed since the last call, in commit order, whoever
// made it (ServiceDb's final-transition log), and answers the API calls whose job another
// connection ended (another daemon, a CLI cancel).
void Service::publish_finals() {
  if (done_) return;
  constexpr int64_t kBatch = 256;
  std::vector<FinalEvent> events;
  do {
    if (!store_read("reading the final-event log",
                    [&] { events = service_db_->final_events_after(final_seq_, kBatch); }))
      return;
    for (const FinalEvent& e : events) {
      final_seq_ = e.seq;
      const auto state = job_state_from_string(e.state);
      if (!state) continue;
      if (hooks_.on_final) hooks_.on_final({e.job_id, *state, e.client_key, e.batch_id, e.error});
      if (api_calls_.contains(e.job_id) && !in_flight_.contains(e.job_id) &&
          !api_resolve_job(e.job_id))
        return;  // the store refused the read: api_resolve's periodic look-up answers this call
    }
  } while (static_cast<int64_t>(events.size()) == kBatch);
}

// The log only needs to outlive the slowest reader's poll: an hour is plenty.
void Service::prune_finals() {
  const int64_t now = steady_now_ms();
  if (now - last_prune_ms_ < 60000 || store_health_.failing()) return;
  last_prune_ms_ = now;
  store_write("pruning the final-event log", [&] { service_db_->prune_final_events(3600); });
}

// Jobs in flight whose lease this worker no longer holds (cancelled, or expired and taken over)
// leave the engine at once, freeing their slots; their results could not be recorded anyway.
// False when the store could not say which (checked again at a later poll).
bool Service::stop_lost_jobs() {
  if (in_flight_.empty()) return true;
  std::vector<int64_t> ids;
  for (const auto& [id, job] : in_flight_) ids.push_back(id);
  std::vector<int64_t> lost;
  if (!store_read("checking leases", [&] { lost = store_->not_held(worker_, ids); })) return false;
  if (lost.empty()) return true;
  for (int64_t id : lost)
    spdlog::info("job {}: lease no longer held (cancelled or taken over); engine work stopped", id);
  give_up_claims(lost);
  claim_now_ = true;            // the freed slots can take queued jobs
  api_resolve(/*force=*/true);  // an API request whose job was cancelled or taken over
  return true;
}

// The one way a claim leaves in_flight_ without a result: its engine work is cancelled by
// ticket, so a later claim of the same job is untouched. Ids not in flight are skipped; true
// when any was.
bool Service::give_up_claims(const std::vector<int64_t>& job_ids) {
  std::vector<Ticket> tickets;
  for (int64_t id : job_ids) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) continue;
    tickets.push_back(it->second.ticket);
    in_flight_.erase(it);
  }
  worker_engine_->cancel(tickets);
  return !tickets.empty();
}

void Service::arm_renew() {
  if (done_) return;
  // A third of the lease: two renewals can be missed (a slow disk, a long step) before expiry.
  renew_timer_.expires_after(std::chrono::milliseconds(std::max<int64_t>(200, cfg_.lease_s * 333)));
  renew_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    guarded("lease renewal", [this] {
      // Jobs whose result waits for the store keep their lease too: the result is still ours
      // to write, and no other worker should run them meanwhile.
      std::vector<int64_t> ids;
      for (const auto& [id, job] : in_flight_) ids.push_back(id);
      for (const PendingResult& p : pending_) ids.push_back(p.job_id);
      int64_t n = 0;
      if (!ids.empty() &&
          store_write(
              "renewing leases",
              [&] { n = store_->renew(worker_, ids, std::chrono::seconds(cfg_.lease_s)); }) &&
          n < static_cast<int64_t>(ids.size())) {
        spdlog::warn("lease renewal: {} of {} leases were no longer ours", ids.size() - n,
                     ids.size());
        stop_lost_jobs();
      }
    });
    arm_renew();
  });
}

int64_t Service::release_handoff() {
  std::vector<WorkItem> items = worker_engine_->input().take_all();
  if (items.empty()) return 0;
  std::vector<int64_t> ids;
  for (const WorkItem& w : items) {
    ids.push_back(w.job_id);
    in_flight_.erase(w.job_id);
  }
  if (!store_write("giving back jobs",
                   [&] { metrics_.jobs_requeued(store_->release(worker_, ids)); }))
    spdlog::warn("{} job(s) not given back; they run again once their leases expire", ids.size());
  return static_cast<int64_t>(ids.size());
}

}  // namespace moebatch
