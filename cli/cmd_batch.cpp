// `moebatch batch status|wait|cancel|retry|purge NAME` and `moebatch export --batch NAME`: the
// lifecycle of a batch, i.e. of the jobs sharing one batch_id (an imported file, a client run),
// and its OpenAI output files. Each verb acts on the local database (--db) or, with --endpoint,
// through a ZeroMQ ingress (the batch_* commands of docs/zmq.md); both paths end in the same
// JobStore calls (export: queue/batch_export.h's pages), and the exit codes are the same:
// 0 done, 1 the batch is not in a state for it (nothing to cancel, to retry, unfinished jobs
// for purge; `wait`: a job failed or was cancelled, or --timeout passed), 2 usage errors and a
// batch with no jobs.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/queue_cli.h"
#include "common/error.h"
#include "common/json_parse.h"
#include "queue/batch_export.h"
#include "queue/job_json.h"
#include "queue/job_validate.h"
#include "queue/zmq/client.h"
#include "queue/zmq/protocol.h"

namespace moebatch::cli {
namespace {

using nlohmann::json;

/// Where the verbs act: the local store or a remote ingress.
class BatchTarget {
 public:
  virtual ~BatchTarget() = default;
  virtual BatchCounts counts(const std::string& batch) = 0;
  virtual int64_t cancel(const std::string& batch) = 0;
  virtual int64_t retry(const std::string& batch) = 0;
  virtual PurgeOutcome purge(const std::string& batch) = 0;
  /// The export page after job after_id.
  virtual BatchExportPage results(const std::string& batch, int64_t after_id) = 0;
};

class LocalTarget : public BatchTarget {
 public:
  explicit LocalTarget(std::unique_ptr<JobStore> store) : store_(std::move(store)) {}
  BatchCounts counts(const std::string& b) override { return store_->batch_counts(b); }
  int64_t cancel(const std::string& b) override { return store_->cancel_batch(b); }
  int64_t retry(const std::string& b) override { return store_->retry_batch(b); }
  PurgeOutcome purge(const std::string& b) override { return store_->purge_batch(b); }
  BatchExportPage results(const std::string& b, int64_t after_id) override {
    return batch_export_page(*store_, b, after_id, zmq_ingress::kMaxResultsPage,
                             zmq_ingress::kResultsPageBytes);
  }

 private:
  std::unique_ptr<JobStore> store_;
};

class RemoteTarget : public BatchTarget {
 public:
  explicit RemoteTarget(const zmq_ingress::RemoteSubmitFlags& flags)
      : client_(zmq_ingress::client_options_from(flags)) {}
  BatchCounts counts(const std::string& b) override {
    return batch_counts_from_json(client_.call_batch("batch_status", b)["batch"]);
  }
  int64_t cancel(const std::string& b) override {
    return integer(client_.call_batch("batch_cancel", b), "jobs_cancelled");
  }
  int64_t retry(const std::string& b) override {
    return integer(client_.call_batch("batch_retry", b), "jobs_requeued");
  }
  PurgeOutcome purge(const std::string& b) override {
    const json r = client_.call_batch("batch_purge", b);
    return {integer(r, "jobs_deleted"), integer(r, "jobs_unfinished")};
  }
  BatchExportPage results(const std::string& b, int64_t after_id) override {
    const json r = client_.call_batch(
        "batch_results", b, {{"after_id", after_id}, {"limit", zmq_ingress::kMaxResultsPage}});
    if (!r.contains("results")) throw Error("malformed batch reply: results");
    BatchExportPage page = batch_export_page_from_json(r["results"]);
    if (page.last_id && *page.last_id <= after_id) throw Error("the export page did not advance");
    return page;
  }

 private:
  static int64_t integer(const json& reply, const char* key) {
    if (!reply.contains(key) || !reply[key].is_number_integer()) {
      throw Error(std::string("malformed batch reply: ") + key);
    }
    return reply[key].get<int64_t>();
  }
  zmq_ingress::LazyPirateClient client_;
};

/// Options of every batch verb.
struct BatchFlags {
  CommonFlags common;
  std::string name;
  zmq_ingress::RemoteSubmitFlags remote;
  int64_t interval_ms = 1000;  // wait: between polls
  int64_t timeout_s = 0;       // wait: give up after this long; 0 = never
  bool no_progress = false;    // wait: never draw the bar
};

std::unique_ptr<BatchTarget> open_target(const CommonFlags& common,
                                         const zmq_ingress::RemoteSubmitFlags& remote,
                                         const std::string& name) {
  if (auto e = find_id_error("batch", name, JobLimits{})) throw InputError(*e);
  if (!remote.endpoint.empty()) return std::make_unique<RemoteTarget>(remote);
  return std::make_unique<LocalTarget>(open_store(common));
}

// A name without jobs is almost always a typo: a usage error, on every verb.
BatchCounts counts_of(BatchTarget& t, const std::string& name) {
  BatchCounts c = t.counts(name);
  if (c.total == 0) throw InputError("no jobs in batch '" + printable(name) + "'");
  return c;
}

void print_counts(const std::string& name, const BatchCounts& c, bool as_json, json extra = {}) {
  if (as_json) {
    json out = batch_counts_to_json(name, c);
    if (extra.is_object()) {
      for (auto& [k, v] : extra.items()) out[k] = v;
    }
    std::cout << dump_json(out) << "\n";
    return;
  }
  std::cout << "batch " << printable(name) << ": " << c.total << " job(s)\n";
  for (const auto& [state, n] : c.counts) {
    std::cout << fmt::format("  {:<12} {}\n", job_state_to_string(state), n);
  }
  std::cout << fmt::format("  {:<12} {} prompt, {} completion\n", "tokens", c.prompt_tokens,
                           c.completion_tokens);
  std::cout << fmt::format("  {:<12} {}\n", "enqueued", format_time(c.first_enqueued_at));
  if (c.last_finished_at) {
    std::cout << fmt::format("  {:<12} {}\n", "last final", format_time(c.last_finished_at));
  }
}

int64_t failed_or_cancelled(const BatchCounts& c) {
  return c.counts.at(JobState::Failed) + c.counts.at(JobState::Cancelled);
}

std::string duration(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02d}", t / 60, t % 60);
}

// Polls until no job is queued or running. On a terminal the bar shows finished / total,
// generated tokens per second and the time left at the rate seen since the wait began.
void run_wait(BatchFlags& f) {
  if (f.interval_ms < 10 || f.interval_ms > 3600000) {
    throw InputError("--interval-ms must be within 10..3600000");
  }
  if (f.timeout_s < 0) throw InputError("--timeout must not be negative");
  auto target = open_target(f.common, f.remote, f.name);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  BatchCounts c = counts_of(*target, f.name);
  const int64_t final0 = c.total - c.unfinished();
  const int64_t tokens0 = c.completion_tokens;
  {
    ProgressBar bar("waiting ", progress_wanted(f.no_progress));
    for (;;) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const int64_t finals = c.total - c.unfinished();
      std::string suffix;
      if (elapsed > 0.5) {
        const double tok_s = static_cast<double>(c.completion_tokens - tokens0) / elapsed;
        const double rate = static_cast<double>(finals - final0) / elapsed;
        suffix = fmt::format(
            "  {:.1f} tok/s  ETA {}", tok_s,
            rate > 0 ? duration(static_cast<double>(c.unfinished()) / rate) : std::string("--"));
      }
      bar.update(static_cast<size_t>(finals), static_cast<size_t>(c.total), suffix);
      if (c.unfinished() == 0) break;
      if (f.timeout_s > 0 && elapsed >= static_cast<double>(f.timeout_s)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(f.interval_ms));
      c = target->counts(f.name);
    }
  }
  print_counts(f.name, c, f.common.json);
  if (c.unfinished() > 0) {
    throw Error("timed out after " + std::to_string(f.timeout_s) + " s with " +
                std::to_string(c.unfinished()) + " job(s) unfinished");
  }
  if (failed_or_cancelled(c) > 0) throw CLI::RuntimeError(1);  // finished, not all succeeded
}

void run_verb(const std::string& verb, BatchFlags& f) {
  auto target = open_target(f.common, f.remote, f.name);
  const std::string name = printable(f.name);
  if (verb == "status") {
    print_counts(f.name, counts_of(*target, f.name), f.common.json);
    return;
  }
  counts_of(*target, f.name);  // refuses a batch without jobs before changing anything
  if (verb == "cancel") {
    const int64_t n = target->cancel(f.name);
    if (f.common.json) print_counts(f.name, target->counts(f.name), true, {{"cancelled", n}});
    if (n == 0) throw Error("batch " + name + " has no queued or running job to cancel");
    if (!f.common.json) std::cout << "cancelled " << n << " job(s) of batch " << name << "\n";
  } else if (verb == "retry") {
    const int64_t n = target->retry(f.name);
    if (f.common.json) print_counts(f.name, target->counts(f.name), true, {{"requeued", n}});
    if (n == 0) throw Error("batch " + name + " has no failed job to retry");
    if (!f.common.json) std::cout << "requeued " << n << " failed job(s) of batch " << name << "\n";
  } else {
    const PurgeOutcome p = target->purge(f.name);
    if (f.common.json) {
      std::cout << dump_json(
                       {{"batch_id", f.name}, {"deleted", p.deleted}, {"unfinished", p.unfinished}})
                << "\n";
    }
    if (p.unfinished > 0) {
      throw Error("batch " + name + " has " + std::to_string(p.unfinished) +
                  " queued or running job(s); wait for them or cancel the batch first");
    }
    if (!f.common.json) std::cout << "purged " << p.deleted << " job(s) of batch " << name << "\n";
  }
}

/// Options of `export`.
struct ExportFlags {
  CommonFlags common;
  zmq_ingress::RemoteSubmitFlags remote;
  std::string batch, output, error_file;
  bool no_progress = false;
};

std::ofstream open_output(const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw InputError("cannot write '" + path + "'");
  return f;
}

// OpenAI's two files: done jobs in the output, failed and cancelled ones in the error file
// (with the output when no error file is named). Unfinished jobs are counted and skipped.
void run_export(const ExportFlags& f) {
  auto target = open_target(f.common, f.remote, f.batch);
  std::ofstream out_file, err_file;
  if (!f.output.empty()) out_file = open_output(f.output);
  if (!f.error_file.empty()) err_file = open_output(f.error_file);
  std::ostream& out = f.output.empty() ? std::cout : out_file;
  std::ostream& err = f.error_file.empty() ? out : err_file;
  size_t done = 0, failed = 0, pending = 0;
  int64_t after = 0;
  {
    // On a terminal: jobs read so far of the batch's total (as counted when the export began).
    ProgressBar bar("exporting ", progress_wanted(f.no_progress));
    const auto total = bar.on() ? static_cast<size_t>(target->counts(f.batch).total) : 0;
    for (;;) {
      const BatchExportPage page = target->results(f.batch, after);
      for (const BatchExportLine& l : page.lines) {
        (l.done ? out : err) << dump_json(l.line) << "\n";
        ++(l.done ? done : failed);
      }
      pending += static_cast<size_t>(page.unfinished);
      bar.update(std::min(done + failed + pending, total), total);
      if (!page.more || !page.last_id) break;
      after = *page.last_id;
    }
  }
  out.flush();
  err.flush();
  if (!out || !err) throw Error("writing the export failed");
  if (done + failed + pending == 0) throw InputError("no jobs in batch '" + f.batch + "'");
  spdlog::info("exported batch {}: {} done, {} failed or cancelled; {} not finished yet",
               printable(f.batch), done, failed, pending);
}

}  // namespace

void register_batch_commands(CLI::App& app) {
  auto ef = std::make_shared<ExportFlags>();
  auto* exp = app.add_subcommand(
      "export",
      "Write a batch's finished jobs as OpenAI Batch output (and error) JSONL, from the "
      "database or, with --endpoint, through a ZeroMQ ingress");
  add_common(exp, ef->common);
  add_remote(exp, ef->remote);
  exp->add_option("--batch", ef->batch, "Batch id")->required();
  exp->add_option("--output,-o", ef->output, "Output file (default stdout)");
  exp->add_option("--error-file", ef->error_file,
                  "Failed and cancelled jobs go here, as OpenAI's error file (default: with "
                  "the done ones in the output)");
  exp->add_flag("--no-progress", ef->no_progress, "Never draw the progress bar");
  exp->callback([ef] { run_export(*ef); });

  auto* batch = app.add_subcommand(
      "batch",
      "A batch's lifecycle: status, wait, cancel, retry, purge (the jobs of one batch id)");
  batch->require_subcommand(1);
  const std::pair<const char*, const char*> verbs[] = {
      {"status", "Counts by state and tokens of a batch's jobs"},
      {"wait",
       "Wait until no job of the batch is queued or running; exit 0 when all are done, "
       "1 otherwise"},
      {"cancel", "Cancel the batch's queued and running jobs"},
      {"retry", "Queue the batch's failed jobs again (attempts start over)"},
      {"purge", "Delete a finished batch's jobs and their results"},
  };
  for (const auto& [verb, help] : verbs) {
    auto f = std::make_shared<BatchFlags>();
    auto* cmd = batch->add_subcommand(verb, help);
    add_common(cmd, f->common);
    add_remote(cmd, f->remote);
    cmd->add_option("name", f->name, "Batch id (for an imported file: its stem, or --batch)")
        ->required();
    const std::string v = verb;
    if (v == "wait") {
      cmd->add_option("--interval-ms", f->interval_ms, "Between polls (default 1000)")
          ->transform(decimal_int());
      cmd->add_option("--timeout", f->timeout_s, "Give up after this many seconds (exit 1)")
          ->transform(decimal_int());
      cmd->add_flag("--no-progress", f->no_progress, "Never draw the progress bar");
      cmd->callback([f] { run_wait(*f); });
    } else {
      cmd->callback([f, v] { run_verb(v, *f); });
    }
  }
}

}  // namespace moebatch::cli
