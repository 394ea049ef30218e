// The io thread's data path: intake (data_version polling, claims, tokenization and
// validation), results (grouped completion transactions), lease renewal, and the periodic
// checks (schedule, operator requests, engine state). Every handler catches what the store
// throws: a transient database error is logged and retried at the next tick, never fatal.
#include <spdlog/spdlog.h>

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
  on_notify();
  if (done_) return;
  try {
    check_schedule();
    claim();
    api_resolve(/*force=*/false);
    batches_tick(/*force=*/false);
  } catch (const std::exception& e) {
    spdlog::error("intake: {} (retrying at the next poll)", e.what());
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
    release_handoff();
    finish_run(0);
  }
}

void Service::claim() {
  if (done_) return;
  const int64_t version = store_->data_version();
  const bool changed = version != last_data_version_;
  last_data_version_ = version;
  if (changed) {
    // Operator requests arrive as rows from another connection, so they move data_version too.
    if (auto req = service_db_->take_request("maintenance", worker_, hooks_.clock->now_ms())) {
      spdlog::info("maintenance requested (request {})", *req);
      start_maintenance("request");
    }
    // A cancel is a commit from another connection too: stop the engine's work on it now.
    stop_lost_jobs();
  }
  if (!admitting_) return;
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
  last_forced_claim_ms_ = now;
  claim_now_ = false;
  std::vector<Job> jobs = store_->claim(worker_, room, std::chrono::seconds(cfg_.lease_s));
  std::vector<int64_t> unplaced;
  for (const Job& job : jobs) {
    auto prepared = prepare_work(job, *tokenizer_, limits_);
    if (auto* reason = std::get_if<std::string>(&prepared)) {
      // A bad job fails alone, for good: retrying cannot fix its input.
      store_->fail(worker_, job.id, *reason, /*retryable=*/false);
      metrics_.job_failed();
      spdlog::info("job {} failed: {}", job.id, *reason);
      api_failed(job.id, invalid_request(*reason, reason->substr(0, reason->find(':'))));
      if (hooks_.on_final)
        hooks_.on_final(
            {job.id, JobState::Failed, job.spec.client_key, job.spec.batch_id, *reason});
      continue;
    }
    InFlightJob f;
    f.enqueued_at = job.enqueued_at;
    f.started_at = job.started_at.value_or(hooks_.clock->now_ms());
    f.stop = job.spec.sampling.stop;
    f.client_key = job.spec.client_key;
    f.batch_id = job.spec.batch_id;
    in_flight_[job.id] = std::move(f);
    WorkItem& item = std::get<WorkItem>(prepared);
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
    store_->release(worker_, unplaced);
  }
  if (static_cast<int64_t>(jobs.size()) == room) claim_now_ = true;  // more may be waiting
}

void Service::drain_results() {
  std::vector<WorkProgress> progress;
  std::vector<WorkResult> results = worker_engine_->take_results(&progress);
  api_progress(progress);
  if (results.empty()) return;
  std::vector<Completion> completions;
  std::vector<std::pair<std::optional<std::string>, std::optional<std::string>>> notice_ids;
  std::vector<int64_t> released;
  const bool dead = worker_engine_->dead();
  try {
    for (WorkResult& r : results) {
      auto it = in_flight_.find(r.job_id);
      if (it == in_flight_.end()) {
        spdlog::warn("result for job {} that is not in flight; ignored", r.job_id);
        continue;
      }
      const InFlightJob job = std::move(it->second);
      // Forget the job before writing: if the write fails, its lease runs out and it runs again
      // (at-least-once), rather than being renewed forever.
      in_flight_.erase(it);
      switch (r.outcome) {
        case WorkOutcome::Finished:
          completions.push_back(make_completion(r, job, *tokenizer_));
          notice_ids.emplace_back(job.client_key, job.batch_id);
          break;
        case WorkOutcome::Rejected:
          store_->fail(worker_, r.job_id, "engine: " + r.error, /*retryable=*/false);
          metrics_.job_failed();
          api_failed(r.job_id, invalid_request("engine: " + r.error));
          if (hooks_.on_final)
            hooks_.on_final(
                {r.job_id, JobState::Failed, job.client_key, job.batch_id, "engine: " + r.error});
          break;
        case WorkOutcome::Aborted:
          if (dead) {
            // Counted as an attempt: a job that kills the engine every time must end failed.
            const FailOutcome o = store_->fail(worker_, r.job_id, r.error, /*retryable=*/true);
            if (o == FailOutcome::Failed && hooks_.on_final)
              hooks_.on_final({r.job_id, JobState::Failed, job.client_key, job.batch_id, r.error});
            metrics_.jobs_requeued(1);
            api_failed(r.job_id,
                       {503, "the engine failed: " + r.error, "", "engine_failed", "server_error"});
          } else {
            released.push_back(r.job_id);
          }
          break;
      }
    }
    if (!released.empty()) {
      metrics_.jobs_requeued(store_->release(worker_, released));
      for (int64_t id : released) api_aborted(id);
    }
    if (!completions.empty()) {
      // One transaction for the whole group: result rows and latency records together.
      const std::vector<bool> landed = store_->complete_many(worker_, completions);
      for (size_t i = 0; i < completions.size(); ++i) {
        const Completion& c = completions[i];
        if (!landed[i]) {
          spdlog::warn("job {}: result not recorded (lease lost or job cancelled)", c.id);
          continue;
        }
        metrics_.job_done(c.latency.queue_wait_ms / 1000.0, c.latency.ttft_ms.value_or(0) / 1000.0,
                          c.latency.total_ms / 1000.0, c.result.completion_tokens);
        api_finished(c);
        if (hooks_.on_final)
          hooks_.on_final(
              {c.id, JobState::Done, notice_ids[i].first, notice_ids[i].second, std::nullopt});
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("result writer: {} (affected jobs run again when their lease ends)", e.what());
  }
  claim_now_ = true;
}

// Jobs in flight whose lease this worker no longer holds (cancelled, or expired and taken over)
// leave the engine at once, freeing their slots; their results could not be recorded anyway.
void Service::stop_lost_jobs() {
  if (in_flight_.empty()) return;
  std::vector<int64_t> ids;
  for (const auto& [id, job] : in_flight_) ids.push_back(id);
  const std::vector<int64_t> lost = store_->not_held(worker_, ids);
  if (lost.empty()) return;
  for (int64_t id : lost) {
    in_flight_.erase(id);
    spdlog::info("job {}: lease no longer held (cancelled or taken over); engine work stopped", id);
  }
  worker_engine_->cancel(lost);
  claim_now_ = true;            // the freed slots can take queued jobs
  api_resolve(/*force=*/true);  // an API request whose job was cancelled or taken over
}

void Service::arm_renew() {
  if (done_) return;
  // A third of the lease: two renewals can be missed (a slow disk, a long step) before expiry.
  renew_timer_.expires_after(std::chrono::milliseconds(std::max<int64_t>(200, cfg_.lease_s * 333)));
  renew_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    if (!in_flight_.empty()) {
      std::vector<int64_t> ids;
      for (const auto& [id, job] : in_flight_) ids.push_back(id);
      try {
        const int64_t n = store_->renew(worker_, ids, std::chrono::seconds(cfg_.lease_s));
        if (n < static_cast<int64_t>(ids.size())) {
          spdlog::warn("lease renewal: {} of {} leases were no longer ours", ids.size() - n,
                       ids.size());
          stop_lost_jobs();
        }
      } catch (const std::exception& e) {
        spdlog::error("lease renewal: {}", e.what());
      }
    }
    arm_renew();
  });
}

void Service::release_handoff() {
  std::vector<WorkItem> items = worker_engine_->input().take_all();
  if (items.empty()) return;
  std::vector<int64_t> ids;
  for (const WorkItem& w : items) {
    ids.push_back(w.job_id);
    in_flight_.erase(w.job_id);
  }
  try {
    metrics_.jobs_requeued(store_->release(worker_, ids));
  } catch (const std::exception& e) {
    spdlog::error("giving back {} jobs: {} (their leases will expire)", ids.size(), e.what());
  }
}

}  // namespace moebatch
