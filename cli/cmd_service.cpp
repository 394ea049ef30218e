// CLI commands of the service module. For now only `moebatch demo`: a queue-only walk-through
// (the engine does not exist yet, so no job is generated and no output is invented). It imports
// the bundled OpenAI Batch example, inserts rows with plain SQL as an external producer would,
// and runs claim / lease expiry / retry / release / cancel cycles on a simulated clock.
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "queue/job_store.h"
#include "queue/openai_batch.h"
#include "queue/schema.h"

namespace moebatch::cli {
namespace {

// The example ships in <repo>/examples; the binary lives in <repo>/<build dir>/moebatch.
std::filesystem::path find_example() {
  const char* name = "examples/demo_batch.jsonl";
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto p = exe.parent_path().parent_path() / name;
    if (std::filesystem::exists(p)) return p;
  }
  if (std::filesystem::exists(name)) return name;
  throw InputError(std::string("cannot find ") + name +
                   " (run from the repository root or pass --file)");
}

void exec_sql(const std::filesystem::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open(db_path.c_str(), &db);
  char* err = nullptr;
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, 5000);
    rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  }
  std::string msg = err ? err : (db ? sqlite3_errmsg(db) : "cannot open");
  sqlite3_free(err);
  sqlite3_close(db);
  if (rc != SQLITE_OK) throw Error("demo producer insert failed: " + msg);
}

void print_jobs(JobStore& store, const std::string& title) {
  std::cout << "\n== " << title << "\n";
  std::cout << fmt::format("{:>4}  {:<9} {:>4} {:>4}  {:<22} {:<10} {}\n", "id", "state", "prio",
                           "try", "source/key", "lease", "error");
  for (const Job& j : store.list({})) {
    std::string err = j.error.value_or("");
    if (err.size() > 60) err = err.substr(0, 57) + "...";
    std::cout << fmt::format("{:>4}  {:<9} {:>4} {:>4}  {:<22} {:<10} {}\n", j.id,
                             job_state_to_string(j.state), j.spec.priority, j.attempts,
                             j.spec.client_key.value_or("-"), j.lease_owner.value_or("-"), err);
  }
}

std::vector<int64_t> ids_of(const std::vector<Job>& jobs) {
  std::vector<int64_t> ids;
  for (const Job& j : jobs) ids.push_back(j.id);
  return ids;
}

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

void run_demo(const std::string& file_flag, bool keep) {
  std::filesystem::path example =
      file_flag.empty() ? find_example() : std::filesystem::path(file_flag);
  std::string tmpl = (std::filesystem::temp_directory_path() / "moebatch-demo-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory for the demo");
  const std::filesystem::path dir = tmpl;
  const std::filesystem::path db = dir / "jobs.db";
  auto clock = std::make_shared<ManualClock>(SystemClock().now_ms());
  std::cout << "moebatch demo: the durable job queue on its own.\n"
            << "The inference engine is not built yet, so this demo generates no text: no job\n"
            << "reaches 'done'. Generation arrives with the engine. Time below is simulated.\n"
            << "database: " << db.string() << "\n";
  {
    StoreOptions o;
    o.path = db;
    o.clock = clock;
    JobStore store(o);

    // 1. An OpenAI Batch file through the same importer `moebatch submit --file` uses.
    BatchFile batch = read_batch_file(example, "demo", store.options().limits, BatchFileLimits{});
    if (!batch.errors.empty()) throw InputError(batch.errors.front());
    auto ids = store.submit_many(batch.specs);
    std::cout << "\nimported " << ids.size() << " requests from " << example.string() << "\n";

    // 2. An external producer: plain SQL from another connection (schemas/README.md), plus one
    //    row that breaks the contract.
    exec_sql(db, std::string(external_insert_example_sql()));
    exec_sql(db,
             "INSERT INTO jobs (client_key, prompt, max_tokens, priority) "
             "VALUES ('bad-row', 'x', -5, 9)");
    std::cout << "inserted 3 rows with plain SQL (2 valid, 1 with max_tokens = -5)\n";
    print_jobs(store, "queue after ingest");

    // 3. worker-a claims 4 jobs (priority first) with a 30 s lease, then goes silent.
    auto a = store.claim("worker-a", 4, std::chrono::seconds(30));
    std::cout << "\nworker-a claimed jobs " << join_ids(ids_of(a)) << " (30 s lease)\n";
    if (auto bad = store.get_by_key("bad-row")) {
      std::cout << "the bad row (highest priority) was checked at claim time: "
                << job_state_to_string(bad->state) << ", " << bad->error.value_or("no error")
                << "\n";
    }
    clock->advance(20000);
    std::cout << "t+20 s: worker-a renews its leases: "
              << store.renew("worker-a", ids_of(a), std::chrono::seconds(30)) << " renewed\n";
    print_jobs(store, "worker-a holds leases");

    // 4. worker-a stops renewing (crashed); after expiry worker-b takes the jobs over.
    clock->advance(31000);
    auto b = store.claim("worker-b", 4, std::chrono::seconds(30));
    std::cout << "\nt+51 s: worker-a's leases expired; worker-b claimed " << join_ids(ids_of(b))
              << "\n";
    std::cout << "worker-a tries to report a result late: "
              << (store.complete("worker-a", a.front().id, JobResult{}, LatencyRecord{})
                      ? "accepted (BUG)"
                      : "rejected, it no longer holds the lease")
              << "\n";

    // 5. A retryable failure backs off; the rest are released (as a maintenance drain does);
    //    one job is cancelled.
    if (!b.empty()) {
      FailOutcome f = store.fail("worker-b", b.front().id, "transient error (demo)", true);
      std::cout << "worker-b reports a transient failure on job " << b.front().id << ": "
                << (f == FailOutcome::Retrying ? "requeued with backoff" : "failed") << "\n";
      std::vector<int64_t> rest = ids_of(b);
      rest.erase(rest.begin());
      std::cout << "worker-b releases " << store.release("worker-b", rest)
                << " job(s) for a maintenance drain (attempt not counted)\n";
    }
    std::cout << "cancel job " << ids.back().id << ": "
              << (store.cancel(ids.back().id) ? "cancelled" : "not cancellable") << "\n";
    print_jobs(store, "final queue");

    QueueStats st = store.stats();
    std::cout << "\n== stats\n";
    for (const auto& [state, n] : st.counts) {
      std::cout << fmt::format("{:<10} {:>4}\n", job_state_to_string(state), n);
    }
    std::cout << "latency records: " << st.total_ms.count
              << " (written when the engine completes jobs)\n";
  }
  if (keep) {
    std::cout << "\nkept " << db.string() << "; try: moebatch list --db " << db.string() << "\n";
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace

void register_service_commands(CLI::App& app) {
  struct DemoFlags {
    std::string file;
    bool keep = false;
  };
  auto f = std::make_shared<DemoFlags>();
  auto* demo =
      app.add_subcommand("demo", "Queue walk-through on a temporary database (no engine yet)");
  demo->add_option("--file", f->file,
                   "OpenAI Batch JSONL to import (default examples/demo_batch.jsonl)");
  demo->add_flag("--keep", f->keep, "Keep the temporary database and print its path");
  demo->callback([f] { run_demo(f->file, f->keep); });
}

}  // namespace moebatch::cli
