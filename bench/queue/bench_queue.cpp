// Job queue throughput on a real SQLite file: ingest rows/s with one transaction per row versus
// submit_many batches, and claim + complete_many jobs/s, for synchronous NORMAL and FULL.
// With --db (a SQLite file or a postgresql:// URL; repeatable) it measures claim scaling
// instead: 1, 2, 4 (--workers) concurrent claimers draining one queue (bench_workers.h).
// Prints a table; --json PATH writes the same numbers.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/queue/bench_workers.h"
#include "queue/job_store.h"

namespace {

using moebatch::Completion;
using moebatch::JobResult;
using moebatch::JobSpec;
using moebatch::JobStore;
using moebatch::StoreOptions;
using moebatch::Synchronous;
using Clock = std::chrono::steady_clock;

// Wall time and this process's CPU time: the machine is shared, so CPU time is the figure that
// does not depend on what else is running (fsync waits show up only in wall time).
struct Row {
  std::string sync, op;
  int64_t items = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  double per_s() const { return seconds > 0 ? static_cast<double>(items) / seconds : 0; }
  double per_cpu_s() const {
    return cpu_seconds > 0 ? static_cast<double>(items) / cpu_seconds : 0;
  }
};

double cpu_now() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

JobSpec spec(int64_t i) {
  JobSpec s;
  s.client_key = "bench-" + std::to_string(i);
  s.batch_id = "bench";
  // A realistic short prompt (~200 bytes) so row size is not trivially small.
  s.prompt = "Request " + std::to_string(i) +
             ": summarize the following paragraph about sparse mixture-of-experts routing, "
             "expert load balancing and the effect of top-k on throughput in two sentences.";
  s.sampling.max_tokens = 128;
  return s;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<Row> bench_mode(const std::filesystem::path& dir, Synchronous sync, int64_t single,
                            int64_t batched, int64_t chunk, int64_t claim_batch) {
  const std::string name = sync == Synchronous::Full ? "FULL" : "NORMAL";
  const auto path = dir / ("bench-" + name + ".db");
  std::filesystem::remove(path);
  StoreOptions o;
  o.path = path;
  o.synchronous = sync;
  JobStore store(o);
  std::vector<Row> rows;

  auto t0 = Clock::now();
  double c0 = cpu_now();
  for (int64_t i = 0; i < single; ++i) store.submit(spec(i));
  rows.push_back({name, "ingest, 1 row/txn", single, seconds_since(t0), cpu_now() - c0});

  std::vector<JobSpec> specs;
  specs.reserve(static_cast<size_t>(chunk));
  t0 = Clock::now();
  c0 = cpu_now();
  for (int64_t start = single; start < single + batched; start += chunk) {
    specs.clear();
    for (int64_t i = start; i < std::min(single + batched, start + chunk); ++i)
      specs.push_back(spec(i));
    store.submit_many(specs);
  }
  rows.push_back({name, "ingest, " + std::to_string(chunk) + " rows/txn", batched,
                  seconds_since(t0), cpu_now() - c0});

  int64_t done = 0;
  t0 = Clock::now();
  c0 = cpu_now();
  for (;;) {
    auto jobs = store.claim("bench", claim_batch, std::chrono::minutes(5));
    if (jobs.empty()) break;
    std::vector<Completion> cs;
    cs.reserve(jobs.size());
    for (const auto& j : jobs)
      cs.push_back({j.id, JobResult{"ok", 40, 1, "stop", {}}, {1, 1, 1, 2, 1.0}});
    for (bool ok : store.complete_many("bench", cs)) done += ok ? 1 : 0;
  }
  rows.push_back({name, "claim+complete, " + std::to_string(claim_batch) + "/txn", done,
                  seconds_since(t0), cpu_now() - c0});
  return rows;
}

// The --db mode: a table of jobs/s and claims/s per store and worker count.
int run_scaling(const std::vector<std::string>& dbs, const std::vector<int>& workers, int64_t jobs,
                int64_t claim_batch, const std::string& json_path) {
  std::vector<moebatch::bench::WorkerRun> runs;
  try {
    for (const std::string& db : dbs) {
      auto r = moebatch::bench::run_worker_bench(db, workers, jobs, claim_batch);
      runs.insert(runs.end(), r.begin(), r.end());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_queue: %s\n", e.what());
    return 1;
  }
  std::printf("%-9s %7s %11s %8s %8s %10s %10s %12s\n", "store", "workers", "claim batch", "jobs",
              "wall s", "jobs/s", "claims/s", "double claims");
  nlohmann::json out = {{"benchmark", "queue_workers"}, {"results", nlohmann::json::array()}};
  bool ok = true;
  for (const auto& r : runs) {
    std::printf("%-9s %7d %11lld %8lld %8.3f %10.0f %10.0f %12lld\n", r.store.c_str(), r.workers,
                static_cast<long long>(r.claim_batch), static_cast<long long>(r.jobs), r.seconds,
                static_cast<double>(r.jobs) / r.seconds, static_cast<double>(r.claims) / r.seconds,
                static_cast<long long>(r.double_claims));
    ok = ok && r.double_claims == 0 && r.jobs > 0;
    out["results"].push_back({{"store", r.store},
                              {"workers", r.workers},
                              {"claim_batch", r.claim_batch},
                              {"jobs", r.jobs},
                              {"claims", r.claims},
                              {"seconds", r.seconds},
                              {"double_claims", r.double_claims}});
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_queue: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  if (!ok) std::fprintf(stderr, "bench_queue: a job was claimed twice or nothing ran\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moebatch job queue benchmark"};
  int64_t single = 5000, batched = 200000, chunk = 1000, claim_batch = 64;
  std::string json_path, dir_flag, modes = "both";
  app.add_option("--single", single, "Rows inserted one transaction each")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--batched", batched, "Rows inserted with submit_many")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--chunk", chunk, "Rows per submit_many transaction")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--claim-batch", claim_batch, "Jobs per claim/complete_many")
      ->check(CLI::Range(1, 100000));
  app.add_option("--sync", modes, "normal|full|both")
      ->check(CLI::IsMember({"normal", "full", "both"}));
  app.add_option("--dir", dir_flag, "Directory for the database files (default: a temp dir)");
  app.add_option("--json", json_path, "Write results as JSON to this path");
  std::vector<std::string> dbs;
  std::vector<int> workers{1, 2, 4};
  int64_t worker_jobs = 20000;
  app.add_option("--db", dbs,
                 "Claim scaling on this database (SQLite file or postgresql:// URL; its jobs "
                 "are DELETED); repeatable");
  app.add_option("--workers", workers, "Claimer counts for --db (default 1 2 4)")
      ->check(CLI::Range(1, 256));
  app.add_option("--worker-jobs", worker_jobs, "Jobs drained per --db run")
      ->check(CLI::Range(1, 10000000));
  CLI11_PARSE(app, argc, argv);
  if (!dbs.empty()) return run_scaling(dbs, workers, worker_jobs, claim_batch, json_path);

  std::filesystem::path dir = dir_flag.empty() ? std::filesystem::temp_directory_path() /
                                                     ("moebatch-bench-" + std::to_string(getpid()))
                                               : std::filesystem::path(dir_flag);
  std::filesystem::create_directories(dir);
  std::vector<Row> rows;
  try {
    for (Synchronous s : {Synchronous::Normal, Synchronous::Full}) {
      if (modes == "normal" && s == Synchronous::Full) continue;
      if (modes == "full" && s == Synchronous::Normal) continue;
      auto r = bench_mode(dir, s, single, batched, chunk, claim_batch);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_queue: %s\n", e.what());
    return 1;
  }
  if (dir_flag.empty()) std::filesystem::remove_all(dir);

  std::printf("%-7s %-28s %9s %8s %10s %8s %11s\n", "sync", "operation", "items", "wall s",
              "items/s", "cpu s", "items/cpu-s");
  nlohmann::json out = {{"benchmark", "queue"}, {"results", nlohmann::json::array()}};
  for (const Row& r : rows) {
    std::printf("%-7s %-28s %9lld %8.3f %10.0f %8.3f %11.0f\n", r.sync.c_str(), r.op.c_str(),
                static_cast<long long>(r.items), r.seconds, r.per_s(), r.cpu_seconds,
                r.per_cpu_s());
    out["results"].push_back({{"sync", r.sync},
                              {"operation", r.op},
                              {"items", r.items},
                              {"seconds", r.seconds},
                              {"per_second", r.per_s()},
                              {"cpu_seconds", r.cpu_seconds},
                              {"per_cpu_second", r.per_cpu_s()}});
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_queue: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
