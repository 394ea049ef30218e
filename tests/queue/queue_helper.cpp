// Helper process for the queue tests: plays a producer or a worker against a real database
// (DB: a SQLite file or a postgresql:// URL).
//   queue_helper produce     DB PREFIX N CHUNK [MAX_TOKENS]  submit N jobs keyed PREFIX-i via
//                                                JobStore
//   queue_helper produce-sql DB PREFIX N CHUNK [MAX_TOKENS]  insert N rows with plain SQL
//                                                (external producer)
//   (MAX_TOKENS: every job gets it and greedy sampling, for runs on a real engine; without it
//   the queue's defaults)
//   queue_helper hold        DB WORKER N LEASE_MS  claim up to N jobs, print their ids, then
//                                                 sleep until killed (a crashed worker)
// Prints one line when its work is done; exits 2 on bad arguments, 1 on errors.
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "queue/job_store.h"
#include "queue/pg_conn.h"
#include "queue/store_url.h"

namespace {

using moebatch::JobSpec;
using moebatch::JobStore;
using moebatch::StoreOptions;

StoreOptions options(const char* db) {
  StoreOptions o;
  o.path = db;
  o.busy_timeout = std::chrono::milliseconds(30000);
  return o;
}

// Jobs for a real engine: short and greedy (temperature 0). 0 = the queue's defaults.
struct Sampling {
  int max_tokens = 0;
};

int produce(const char* db, const std::string& prefix, int n, int chunk, Sampling sampling) {
  JobStore store(options(db));
  for (int start = 0; start < n; start += chunk) {
    std::vector<JobSpec> specs;
    for (int i = start; i < std::min(n, start + chunk); ++i) {
      JobSpec s;
      s.client_key = prefix + "-" + std::to_string(i);
      s.batch_id = prefix;
      s.prompt = "prompt " + *s.client_key;
      if (sampling.max_tokens > 0) {
        s.sampling.max_tokens = sampling.max_tokens;
        s.sampling.temperature = 0;
      }
      specs.push_back(std::move(s));
    }
    store.submit_many(specs);
  }
  std::printf("produced %d\n", n);
  return 0;
}

// Plain SQL, one transaction per chunk, on either database.
std::string insert_sql(const std::string& prefix, int start, int end, Sampling sampling) {
  std::string sql;
  const bool sampled = sampling.max_tokens > 0;
  for (int i = start; i < end; ++i) {
    std::string key = prefix + "-" + std::to_string(i);
    sql += std::string("INSERT INTO jobs (client_key, batch_id, prompt") +
           (sampled ? ", max_tokens, temperature" : "") + ") VALUES ('" + key + "', '" + prefix +
           "', 'prompt " + key + "'" +
           (sampled ? ", " + std::to_string(sampling.max_tokens) + ", 0" : "") + ");";
  }
  return sql;
}

int produce_pg(const char* url, const std::string& prefix, int n, int chunk, Sampling sampling) {
  moebatch::PgConn conn(url);
  for (int start = 0; start < n; start += chunk) {
    conn.exec("BEGIN;" + insert_sql(prefix, start, std::min(n, start + chunk), sampling) +
              "COMMIT;");
  }
  std::printf("produced %d\n", n);
  return 0;
}

int produce_sql(const char* db_path, const std::string& prefix, int n, int chunk,
                Sampling sampling) {
  if (moebatch::parse_store_location(db_path).kind == moebatch::StoreKind::Postgres)
    return produce_pg(db_path, prefix, n, chunk, sampling);
  sqlite3* db = nullptr;
  if (sqlite3_open(db_path, &db) != SQLITE_OK) return 1;
  sqlite3_busy_timeout(db, 30000);
  for (int start = 0; start < n; start += chunk) {
    const std::string sql = "BEGIN IMMEDIATE;" +
                            insert_sql(prefix, start, std::min(n, start + chunk), sampling) +
                            "COMMIT;";
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::fprintf(stderr, "produce-sql: %s\n", err ? err : "?");
      sqlite3_free(err);
      sqlite3_close(db);
      return 1;
    }
  }
  sqlite3_close(db);
  std::printf("produced %d\n", n);
  return 0;
}

int hold(const char* db, const std::string& worker, int n, int lease_ms) {
  JobStore store(options(db));
  auto jobs = store.claim(worker, n, std::chrono::milliseconds(lease_ms));
  std::string line = "claimed " + std::to_string(jobs.size());
  for (const auto& j : jobs) line += " " + std::to_string(j.id);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr,
                 "usage: queue_helper produce|produce-sql|hold DB NAME N ARG [MAX_TOKENS]\n");
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const int n = std::stoi(argv[4]);
    const int arg = std::stoi(argv[5]);
    const Sampling sampling{argc == 7 ? std::stoi(argv[6]) : 0};
    if (mode == "produce") return produce(argv[2], argv[3], n, arg, sampling);
    if (mode == "produce-sql") return produce_sql(argv[2], argv[3], n, arg, sampling);
    if (mode == "hold") return hold(argv[2], argv[3], n, arg);
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_helper: %s\n", e.what());
    return 1;
  }
}
