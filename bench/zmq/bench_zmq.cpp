// Acked submits per second through the ZeroMQ ingress: P producer threads, each a Lazy-Pirate
// REQ client sending messages of B jobs and waiting for each ack (which only comes after the
// commit), against an in-process ingress on tcp loopback over a fresh SQLite file.
// Prints a table; --json PATH writes the same numbers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "queue/zmq/client.h"
#include "queue/zmq/ingress.h"

namespace {

namespace zi = moebatch::zmq_ingress;
using Clock = std::chrono::steady_clock;

struct Row {
  int producers = 0;
  int per_message = 0;
  int64_t jobs = 0;
  double seconds = 0, jobs_per_s = 0, p50_ms = 0, p99_ms = 0;
  uint64_t commits = 0;
};

Row run(const std::filesystem::path& dir, int producers, int per_message, int64_t total_jobs,
        bool full_sync) {
  std::filesystem::path db = dir / ("bench-" + std::to_string(producers) + "x" +
                                    std::to_string(per_message) + ".db");
  std::filesystem::remove(db);
  zi::IngressOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.store.path = db;
  o.store.synchronous = full_sync ? moebatch::Synchronous::Full : moebatch::Synchronous::Normal;
  zi::Ingress ingress(o);
  const int64_t messages_each = std::max<int64_t>(1, total_jobs / producers / per_message);
  std::vector<std::vector<double>> lat(producers);
  const std::string prompt(200, 'p');
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      zi::ClientOptions co;
      co.endpoint = ingress.router_endpoint();
      co.timeout = std::chrono::milliseconds(30000);
      co.attempts = 1;
      zi::LazyPirateClient client(co);
      for (int64_t m = 0; m < messages_each; ++m) {
        std::vector<moebatch::JobSpec> specs(per_message);
        for (int i = 0; i < per_message; ++i) {
          specs[i].prompt = prompt;
          specs[i].client_key = "p" + std::to_string(p) + "-" + std::to_string(m) + "-" +
                                std::to_string(i);
          specs[i].batch_id = "bench";
        }
        auto s = Clock::now();
        client.submit_jobs(std::move(specs), static_cast<size_t>(per_message));
        lat[p].push_back(std::chrono::duration<double, std::milli>(Clock::now() - s).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) { return all[std::min(all.size() - 1, size_t(q * all.size()))]; };
  Row r;
  r.producers = producers;
  r.per_message = per_message;
  r.jobs = messages_each * producers * per_message;
  r.seconds = secs;
  r.jobs_per_s = static_cast<double>(r.jobs) / secs;
  r.p50_ms = pct(0.50);
  r.p99_ms = pct(0.99);
  r.commits = ingress.counters().commits.load();
  if (ingress.counters().jobs_created.load() != static_cast<uint64_t>(r.jobs)) {
    std::fprintf(stderr, "bench_zmq: %llu jobs created, expected %lld\n",
                 static_cast<unsigned long long>(ingress.counters().jobs_created.load()),
                 static_cast<long long>(r.jobs));
    std::exit(1);
  }
  ingress.stop();
  std::filesystem::remove(db);
  std::filesystem::remove(db.string() + "-wal");
  std::filesystem::remove(db.string() + "-shm");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Acked submits per second through the ZeroMQ ingress"};
  std::string json_path, dir = std::filesystem::temp_directory_path().string();
  int64_t jobs = 40000, single_jobs = 4000;
  bool full_sync = false;
  app.add_option("--json", json_path, "Write results as JSON to this path");
  app.add_option("--dir", dir, "Directory for the database files");
  app.add_option("--jobs", jobs, "Jobs per batched configuration (default 40000)");
  app.add_option("--single-jobs", single_jobs, "Jobs per one-job-per-message configuration");
  app.add_flag("--full-sync", full_sync, "SQLite synchronous=FULL");
  CLI11_PARSE(app, argc, argv);

  std::vector<Row> rows;
  for (int producers : {1, 8}) {
    for (int per_message : {1, 100}) {
      rows.push_back(run(dir, producers, per_message, per_message == 1 ? single_jobs : jobs,
                         full_sync));
    }
  }
  std::printf("%-10s %-10s %9s %9s %12s %10s %10s %9s\n", "producers", "jobs/msg", "jobs",
              "seconds", "acked jobs/s", "p50 ms", "p99 ms", "commits");
  nlohmann::json out = {{"benchmark", "zmq_ingress"},
                        {"synchronous", full_sync ? "FULL" : "NORMAL"},
                        {"results", nlohmann::json::array()}};
  for (const Row& r : rows) {
    std::printf("%-10d %-10d %9lld %9.2f %12.0f %10.2f %10.2f %9llu\n", r.producers,
                r.per_message, static_cast<long long>(r.jobs), r.seconds, r.jobs_per_s, r.p50_ms,
                r.p99_ms, static_cast<unsigned long long>(r.commits));
    out["results"].push_back({{"producers", r.producers},
                              {"jobs_per_message", r.per_message},
                              {"jobs", r.jobs},
                              {"seconds", r.seconds},
                              {"acked_jobs_per_s", r.jobs_per_s},
                              {"ack_p50_ms", r.p50_ms},
                              {"ack_p99_ms", r.p99_ms},
                              {"commits", r.commits}});
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_zmq: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
