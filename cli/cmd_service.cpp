// CLI commands of the service module:
//  - `moebatch demo`: the whole pipeline on the bundled random-weight model (service/demo.h);
//  - `moebatch maintenance [--now]`: request a maintenance cycle from a running service / list
//    recorded cycles;
//  - `moebatch queue-demo`: the queue-only walk-through (claims, lease expiry, retry, release,
//    cancel on a simulated clock; no generation).
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "common/json_parse.h"
#include "common/paths.h"
#include "queue/job_store.h"
#include "queue/openai_batch.h"
#include "queue/schema.h"
#include "service/demo.h"
#include "service/service_db.h"

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

void run_queue_demo(const std::string& file_flag, bool keep) {
  std::filesystem::path example =
      file_flag.empty() ? find_example() : std::filesystem::path(file_flag);
  std::string tmpl = (std::filesystem::temp_directory_path() / "moebatch-demo-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory for the demo");
  const std::filesystem::path dir = tmpl;
  const std::filesystem::path db = dir / "jobs.db";
  auto clock = std::make_shared<ManualClock>(SystemClock().now_ms());
  std::cout << "moebatch queue-demo: the durable job queue on its own. It imports a batch file,\n"
            << "inserts rows with plain SQL, then walks claims, lease expiry, a retry, a release\n"
            << "and a cancel. Time below is simulated. No engine runs here, so no job reaches\n"
            << "'done'. Generation arrives with the engine: `moebatch demo` runs it end to end.\n"
            << "database: " << db.string() << "\n";
  {
    StoreOptions o;
    o.path = db;
    o.clock = clock;
    JobStore store(o);

    // 1. An OpenAI Batch file through the same importer `moebatch submit --file` uses.
    BatchFile batch = read_batch_file(example, "demo", store.options().limits, BatchFileLimits{});
    if (!batch.errors.empty()) throw InputError(batch.errors.front().text());
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
              << " (one per completed job; none here, as no engine runs)\n";
  }
  if (keep) {
    std::cout << "\nkept " << db.string() << "; try: moebatch list --db " << db.string() << "\n";
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

void register_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto batching = std::make_shared<std::string>("continuous");
  auto* demo = app.add_subcommand(
      "demo",
      "The whole pipeline in under a minute: start the service on the bundled tiny model (RANDOM "
      "weights: gibberish text) on CPU behind the ZeroMQ ingress, submit jobs through SQL inserts "
      "and ZeroMQ, wait, print throughput and latency");
  demo->add_option("--jobs", o->jobs, "Jobs to submit (default 300, 1..100000)");
  demo->add_option("--max-tokens", o->max_tokens, "max_tokens per job (default 16, 1..512)");
  demo->add_option("--max-num-seqs", o->max_num_seqs, "Batch slots (default 64)");
  demo->add_option("--batching", *batching, "continuous (default) | static");
  demo->add_option("--threads", o->threads, "CPU compute threads (default: all cores)");
  demo->add_option("--db", o->db, "Use this database instead of a temporary one");
  demo->add_flag("--keep", o->keep, "Keep the temporary database and print its path");
  demo->callback([o, batching] {
    if (*batching != "continuous" && *batching != "static")
      throw InputError("--batching: expected continuous or static, got '" + *batching + "'");
    o->batching = *batching == "static" ? BatchingMode::Static : BatchingMode::Continuous;
    const int code = run_service_demo(*o, std::cout);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

// `maintenance --now` leaves a request row that a running service takes at its next poll (the
// insert moves SQLite's PRAGMA data_version, or sends PostgreSQL's NOTIFY, which the service
// watches); without --now it lists cycles.
void register_maintenance_command(CLI::App& app) {
  auto db = std::make_shared<std::string>();
  auto now = std::make_shared<bool>(false);
  auto as_json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "maintenance",
      "Request a maintenance cycle (drain, rebuild the engine, warm up) from the service on "
      "--db with --now; without --now, list the recorded cycles");
  cmd->add_option("--db", *db, "Job database (default $MOEBATCH_DB or the user data dir)");
  cmd->add_flag("--now", *now, "Ask the running service for a cycle now");
  cmd->add_flag("--json", *as_json, "Print JSON");
  cmd->callback([db, now, as_json] {
    const std::string location = db->empty() ? default_db_path().string() : *db;
    // A SQLite file must exist (a typo would otherwise create a database no service reads); a
    // PostgreSQL database is migrated on open, as every store does.
    if (parse_store_location(location).kind == StoreKind::Sqlite &&
        !std::filesystem::exists(location))
      throw InputError("no job database at " + location + " (start the service first)");
    ServiceDb sdb(location);
    if (*now) {
      const int64_t id = sdb.add_request("maintenance", SystemClock().now_ms());
      if (*as_json) {
        std::cout << nlohmann::json{{"request", id}}.dump() << "\n";
      } else {
        std::cout << "maintenance requested (request " << id
                  << "); the service on this database starts the cycle at its next poll\n";
      }
      return;
    }
    nlohmann::json rows = nlohmann::json::array();
    for (const CycleRecord& c : sdb.cycles()) {
      rows.push_back({{"id", c.id},
                      {"worker", c.worker},
                      {"trigger", c.trigger},
                      {"started_at", c.started_at},
                      {"ended_at", c.ended_at},
                      {"downtime_ms", c.downtime_ms},
                      {"drained", c.drained},
                      {"requeued", c.requeued},
                      {"mem_before", c.mem_before},
                      {"mem_after", c.mem_after},
                      {"warmup_ms", c.warmup_ms},
                      {"result", c.result},
                      {"error", c.error}});
    }
    if (*as_json) {
      std::cout << dump_json(rows) << "\n";
      return;
    }
    std::cout << fmt::format("{:>4}  {:<8} {:>11} {:>8} {:>8} {:>10} {:>10}  {}\n", "id", "trigger",
                             "downtime_ms", "drained", "requeued", "mem_before", "mem_after",
                             "result");
    for (const auto& r : rows) {
      std::cout << fmt::format(
          "{:>4}  {:<8} {:>11} {:>8} {:>8} {:>9.1f}M {:>9.1f}M  {}{}\n", r["id"].get<int64_t>(),
          r["trigger"].get<std::string>(), r["downtime_ms"].get<int64_t>(),
          r["drained"].get<int64_t>(), r["requeued"].get<int64_t>(),
          r["mem_before"].get<int64_t>() / 1048576.0, r["mem_after"].get<int64_t>() / 1048576.0,
          r["result"].get<std::string>(),
          r["error"].get<std::string>().empty() ? "" : ": " + r["error"].get<std::string>());
    }
  });
}

}  // namespace

void register_service_commands(CLI::App& app) {
  register_demo_command(app);
  register_maintenance_command(app);
  struct QueueDemoFlags {
    std::string file;
    bool keep = false;
  };
  auto f = std::make_shared<QueueDemoFlags>();
  auto* demo = app.add_subcommand(
      "queue-demo",
      "Queue-only walk-through on a temporary database and a simulated clock (no engine, no "
      "text; `moebatch demo` runs the whole pipeline)");
  demo->add_option("--file", f->file,
                   "OpenAI Batch JSONL to import (default examples/demo_batch.jsonl)");
  demo->add_flag("--keep", f->keep, "Keep the temporary database and print its path");
  demo->callback([f] { run_queue_demo(f->file, f->keep); });
}

}  // namespace moebatch::cli
