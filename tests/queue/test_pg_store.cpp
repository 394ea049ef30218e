// What only the PostgreSQL store has: migrations raced by several openers, claimers in parallel
// sessions (FOR UPDATE SKIP LOCKED), change notices by LISTEN/NOTIFY that idle claimers do not
// send, and a connection that comes back after the server dropped it.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::store_options;
using test::text_job;

// fn on `n` threads at once; what they threw.
std::vector<std::string> at_once(int n, const std::function<void()>& fn) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> errors;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&] {
      try {
        fn();
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(PgStore, ConcurrentOpenersMigrateOnce) {
  test::PgTestDatabase db;
  const std::vector<std::string> errors = at_once(4, [&] {
    JobStore s(store_options(db.url()));
    if (s.schema_version() != JobStore::schema_version_latest(StoreKind::Postgres))
      throw Error("schema version " + std::to_string(s.schema_version()));
  });
  EXPECT_TRUE(errors.empty()) << errors.front();
  test::PgSqlConnection sql(db.url());
  EXPECT_EQ(sql.query_i64("SELECT count(*) FROM moebatch_schema"), 1);
}

TEST(PgStore, ANewerSchemaIsRefused) {
  test::PgTestDatabase db;
  { JobStore s(store_options(db.url())); }
  test::PgSqlConnection sql(db.url());
  ASSERT_EQ(sql.exec("UPDATE moebatch_schema SET version = 999"), "");
  try {
    JobStore s(store_options(db.url()));
    ADD_FAILURE() << "opened a database from a newer build";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("newer than this build"), std::string::npos) << e.what();
  }
}

// A file stored in one piece past kFileChunkBytes (as migration 5 moved the contents written
// before it) is cut into pieces by the BatchStores that open the database — once, however many
// open it at the same moment — and reads back the same.
TEST(PgStore, OpenersCutAFileStoredInOnePieceOnce) {
  test::PgTestDatabase db;
  { JobStore s(store_options(db.url())); }
  test::PgSqlConnection sql(db.url());
  ASSERT_EQ(sql.exec("INSERT INTO files (id, purpose, filename, bytes, created_at) "
                     "VALUES ('file-big', 'batch_output', 'big.jsonl', 1200009, 3)"),
            "");
  ASSERT_EQ(sql.exec("INSERT INTO file_chunks (file_id, seq, data) "
                     "VALUES ('file-big', 0, '{\"x\":\"' || repeat('€', 400000) || '\"}' || chr(10))"),
            "");
  const std::vector<std::string> errors = at_once(4, [&] { BatchStore s(db.url()); });
  ASSERT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(sql.query_i64("SELECT count(*) FROM file_chunks WHERE file_id = 'file-big'"), 2);
  EXPECT_EQ(sql.query_i64("SELECT count(*) FROM file_chunks WHERE file_id = 'file-big' AND octet_length(data) > 1048576"),
            0);
  std::string big = "{\"x\":\"";
  for (int i = 0; i < 400000; ++i) big += "\xE2\x82\xAC";
  big += "\"}\n";
  BatchStore files(db.url());
  EXPECT_EQ(files.file_content("file-big"), std::optional<std::string>(big));
}

TEST(PgStore, UnreachableServerIsAClearError) {
  const auto& srv = test::pg_test_server();
  StoreOptions o =
      store_options("postgresql://" + srv.user + "@/jobs?host=/nonexistent-dir&port=" + srv.port);
  try {
    JobStore s(o);
    ADD_FAILURE() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect to PostgreSQL"), std::string::npos)
        << e.what();
  }
}

TEST(PgStore, ParallelClaimersNeverShareAJob) {
  test::PgTestDatabase db;
  constexpr int kJobs = 600;
  {
    JobStore s(store_options(db.url()));
    std::vector<JobSpec> specs;
    for (int i = 0; i < kJobs; ++i) specs.push_back(text_job("job " + std::to_string(i)));
    s.submit_many(specs);
  }
  std::mutex mu;
  std::map<int64_t, int> done;  // job -> completions that landed
  std::vector<std::string> errors;
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      try {
        JobStore s(store_options(db.url()));
        const std::string me = "w" + std::to_string(w);
        for (;;) {
          auto jobs = s.claim(me, 7, milliseconds(60000));
          if (jobs.empty()) break;
          std::vector<Completion> cs;
          for (const Job& j : jobs) cs.push_back({j.id, JobResult{me, 1, 1, "stop", {}}, {}});
          auto ok = s.complete_many(me, cs);
          std::lock_guard lock(mu);
          for (size_t i = 0; i < ok.size(); ++i) done[cs[i].id] += ok[i] ? 1 : 0;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : workers) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(static_cast<int>(done.size()), kJobs);
  for (const auto& [id, n] : done) EXPECT_EQ(n, 1) << "job " << id;
  JobStore s(store_options(db.url()));
  const QueueStats st = s.stats();
  EXPECT_EQ(st.counts.at(JobState::Done), kJobs);
  EXPECT_EQ(st.total_ms.count, kJobs);
}

TEST(PgStore, IdleClaimsWakeNobodyAndInsertsWakeEveryone) {
  test::PgTestDatabase db;
  JobStore a(store_options(db.url()));
  JobStore b(store_options(db.url()));
  const int64_t v0 = b.data_version();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a.claim("a", 10, milliseconds(1000)).empty());
  EXPECT_EQ(a.requeue_expired(), 0);
  EXPECT_EQ(b.data_version(), v0) << "a statement that changed nothing woke another daemon";
  a.submit(text_job("p"));
  // NOTIFY is delivered at commit, asynchronously: give it a moment.
  int64_t v1 = v0;
  for (int i = 0; i < 200 && v1 == v0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    v1 = b.data_version();
  }
  EXPECT_NE(v1, v0);
  const int64_t own = a.data_version();
  a.submit(text_job("q"));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(a.data_version(), own) << "own commits must not count";
}

TEST(PgStore, AStoreReconnectsAfterTheServerDroppedItsSession) {
  test::PgTestDatabase db;
  JobStore store(store_options(db.url()));
  JobStore other(store_options(db.url()));
  store.submit(text_job("before"));
  test::PgSqlConnection admin(db.url());
  ASSERT_EQ(admin.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()"),
            "");
  // The first statement on a dropped session fails (the caller's write is refused, as any
  // outage); the next one reconnects, LISTEN included.
  bool reconnected = false;
  for (int i = 0; i < 3 && !reconnected; ++i) {
    try {
      store.submit(text_job("after " + std::to_string(i)));
      reconnected = true;
    } catch (const Error&) {
    }
  }
  ASSERT_TRUE(reconnected);
  int64_t v0 = -1;
  for (int i = 0; i < 3; ++i) {
    try {
      v0 = store.data_version();
      other.list({});
      break;
    } catch (const Error&) {
    }
  }
  other.submit(text_job("from the other session"));
  int64_t v1 = v0;
  for (int i = 0; i < 200 && v1 == v0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    v1 = store.data_version();
  }
  EXPECT_NE(v1, v0) << "no notices after the reconnect";
  EXPECT_GE(store.list({}).size(), 3u);
}

TEST(PgStore, ProducerRowsAreTypedAndIdsAreTheQueues) {
  test::PgTestDatabase db;
  JobStore store(store_options(db.url()));
  test::PgSqlConnection producer(db.url());
  // Typed columns refuse at INSERT what SQLite stores and the claim then fails.
  EXPECT_NE(producer.exec("INSERT INTO jobs (prompt, max_tokens) VALUES ('p', 'lots')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (prompt, temperature) VALUES ('p', 'hot')"), "");
  // id: GENERATED ALWAYS refuses a value, NULL included; forcing one past what the queue has
  // handed out is refused by the trigger; an UPDATE of id is refused.
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) VALUES (5, 'p')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) VALUES (NULL, 'p')"), "");
  const std::string forced = producer.exec(
      "INSERT INTO jobs (id, prompt) OVERRIDING SYSTEM VALUE VALUES (9223372036854775807, 'p')");
  EXPECT_NE(forced.find("jobs.id is assigned by the queue"), std::string::npos) << forced;
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) OVERRIDING SYSTEM VALUE VALUES (0, 'p')"),
            "");
  EXPECT_EQ(store.list({}).size(), 0u);
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt) VALUES ('p')"), "");
  ASSERT_EQ(producer.exec("INSERT INTO jobs (id, prompt) VALUES (DEFAULT, 'p')"), "");
  const int64_t mine = store.submit(text_job("after")).id;
  EXPECT_EQ(producer.query_i64("SELECT max(id) FROM jobs"), mine);
  EXPECT_NE(producer.exec("UPDATE jobs SET id = 9223372036854775807 WHERE id = 1"), "");
  EXPECT_GT(store.submit(text_job("and after")).id, mine);
  EXPECT_EQ(store.claim("w", 10, milliseconds(1000)).size(), 4u);
}

}  // namespace
}  // namespace moebatch
