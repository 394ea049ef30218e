// Schema versioning: a database created at schema version 1 (by hand, as version 1 shipped) is
// migrated forward on open with its data intact; newer-than-known files are refused; the
// migration list itself is checked for order.
#include <gtest/gtest.h>

#include "common/error.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "queue/openai_batch.h"
#include "queue/schema.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::store_options;
using test::TempDir;

// The version-1 schema exactly as it shipped (migration 1 of schemas/jobs.sql).
constexpr const char* kV1Schema = R"sql(
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, client_key TEXT UNIQUE, batch_id TEXT, custom_id TEXT,
  model TEXT, priority INTEGER NOT NULL DEFAULT 0, prompt_kind TEXT NOT NULL DEFAULT 'text',
  prompt TEXT NOT NULL, max_tokens INTEGER NOT NULL DEFAULT 256,
  temperature REAL NOT NULL DEFAULT 1.0, top_p REAL NOT NULL DEFAULT 1.0,
  top_k INTEGER NOT NULL DEFAULT 0, seed INTEGER, stop TEXT,
  state TEXT NOT NULL DEFAULT 'queued'
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL DEFAULT 3,
  lease_owner TEXT, lease_expires_at INTEGER, error TEXT,
  enqueued_at INTEGER NOT NULL
    DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
  started_at INTEGER, first_token_at INTEGER, finished_at INTEGER, result_text TEXT,
  prompt_tokens INTEGER, completion_tokens INTEGER, finish_reason TEXT);
CREATE INDEX jobs_by_batch ON jobs (batch_id, id);
INSERT INTO jobs (client_key, batch_id, prompt, max_tokens, enqueued_at)
  VALUES ('old-queued', 'legacy', 'still waiting', 16, 1000);
INSERT INTO jobs (client_key, prompt, state, result_text, prompt_tokens, completion_tokens,
                  finish_reason, finished_at, enqueued_at)
  VALUES ('old-done', 'was run', 'done', 'legacy answer', 3, 2, 'stop', 2000, 1500);
PRAGMA user_version = 1;
)sql";

TEST(Migration, VersionOneDatabaseIsUpgradedWithDataIntact) {
  TempDir dir;
  auto db = dir.path() / "v1.db";
  ASSERT_EQ(test::exec_sql(db, kV1Schema), "");
  auto clock = std::make_shared<ManualClock>(10'000);
  JobStore store(store_options(db, clock));
  EXPECT_EQ(store.schema_version(), JobStore::schema_version_latest());

  auto done = store.get_by_key("old-done");
  ASSERT_TRUE(done && done->result);
  EXPECT_EQ(done->state, JobState::Done);
  EXPECT_EQ(done->result->text, "legacy answer");
  EXPECT_EQ(done->finished_at, 2000);

  auto queued = store.get_by_key("old-queued");
  ASSERT_TRUE(queued);
  EXPECT_EQ(queued->not_before, 0) << "new column must default for old rows";
  // The migrated row is claimable and completes with a latency record (table added in v2).
  auto got = store.claim("w", 5, milliseconds(1000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].spec.batch_id, "legacy");
  EXPECT_EQ(got[0].spec.sampling.max_tokens, 16);
  EXPECT_TRUE(store.complete("w", got[0].id, JobResult{"new answer", 2, 2, "stop", {}},
                             LatencyRecord{9000, 1, 1, 9001, 2.0}));
  EXPECT_EQ(store.stats().total_ms.count, 1);

  // Reopening an up-to-date file is a no-op.
  JobStore again(store_options(db, clock));
  EXPECT_EQ(again.list({}).size(), 2u);
}

// A database at schema version 4 (the last release before the id guard and payload hashes)
// with a batch job under the old, ambiguous key spelling.
TEST(Migration, VersionFourGetsTheIdGuardAndUnambiguousBatchKeys) {
  TempDir dir;
  auto db = dir.path() / "v4.db";
  std::string v4;
  for (const Migration& m : parse_migrations(jobs_schema_sql())) {
    if (m.version <= 4) v4 += m.sql;
  }
  v4 += R"sql(
INSERT INTO jobs (client_key, batch_id, custom_id, prompt, max_tokens)
  VALUES ('x/y/z', 'x/y', 'z', 'old batch job', 5);
INSERT INTO jobs (client_key, batch_id, custom_id, prompt) VALUES ('plain/c', 'plain', 'c', 'p');
PRAGMA user_version = 4;
)sql";
  ASSERT_EQ(test::exec_sql(db, v4), "");
  JobStore store(store_options(db, std::make_shared<SystemClock>()));
  EXPECT_EQ(store.schema_version(), JobStore::schema_version_latest());
  // Keys of batch ids with '/' are respelled; the others stay as they were.
  EXPECT_FALSE(store.get_by_key("x/y/z"));
  ASSERT_TRUE(store.get_by_key(batch_client_key("x/y", "z")));
  EXPECT_TRUE(store.get_by_key("plain/c"));
  // Re-importing the old line finds its job; batch "x" with custom_id "y/z" is a job of its own.
  const JobLimits limits;
  const std::string old_line = R"({"custom_id":"z","method":"POST","url":"/v1/completions",)"
                               R"("body":{"prompt":"old batch job","max_tokens":5}})";
  EXPECT_FALSE(store.submit(parse_batch_line(old_line, 1, "x/y", limits)).created);
  const std::string other =
      R"({"custom_id":"y/z","method":"POST","url":"/v1/completions","body":{"prompt":"new"}})";
  EXPECT_TRUE(store.submit(parse_batch_line(other, 1, "x", limits)).created);
  // The id guard is in place for producers.
  test::SqlConnection producer(db);
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) VALUES (9223372036854775807, 'p')"), "");
  EXPECT_EQ(store.list({}).size(), 3u);
}

// Migration 10: a file's content moves from files.content into pieces (file_chunks); the
// content reads back the same, whole and as piece 0, and new files are stored in pieces. A file
// past kFileChunkBytes (one piece after the migration) is cut by the first BatchStore that opens
// the database, at character boundaries, and only once.
TEST(Migration, VersionNineFileContentMovesIntoPieces) {
  TempDir dir;
  auto db = dir.path() / "v9.db";
  std::string v9;
  for (const Migration& m : parse_migrations(jobs_schema_sql())) {
    if (m.version <= 9) v9 += m.sql;
  }
  v9 += R"sql(
INSERT INTO files (id, purpose, filename, bytes, created_at, content)
  VALUES ('file-old', 'batch_output', 'b_output.jsonl', 12, 5, '{"x":"€"}' || char(10));
INSERT INTO files (id, purpose, filename, bytes, created_at, content)
  VALUES ('file-older', 'batch', 'in.jsonl', 3, 4, '{}' || char(10));
INSERT INTO files (id, purpose, filename, bytes, created_at, content)
  VALUES ('file-big', 'batch_output', 'big.jsonl', 1200009, 3,
          '{"x":"' || replace(hex(zeroblob(400000)), '00', '€') || '"}' || char(10));
PRAGMA user_version = 9;
)sql";
  ASSERT_EQ(test::exec_sql(db, v9), "");
  JobStore store(store_options(db, std::make_shared<SystemClock>()));
  EXPECT_EQ(store.schema_version(), JobStore::schema_version_latest());
  BatchStore files(db.string());
  const std::string old = "{\"x\":\"\xE2\x82\xAC\"}\n";
  EXPECT_EQ(files.file("file-old")->bytes, static_cast<int64_t>(old.size()));
  EXPECT_EQ(files.file_content("file-old"), std::optional<std::string>(old));
  EXPECT_EQ(files.file_chunk("file-old", 0), std::optional<std::string>(old));
  EXPECT_FALSE(files.file_chunk("file-old", 1));
  std::string big = "{\"x\":\"";
  for (int i = 0; i < 400000; ++i) big += "\xE2\x82\xAC";
  big += "\"}\n";
  ASSERT_EQ(files.file("file-big")->bytes, static_cast<int64_t>(big.size()));
  EXPECT_EQ(files.file_content("file-big"), std::optional<std::string>(big));
  const auto pieces_of = [](BatchStore& s) {
    std::vector<std::string> pieces;
    while (auto p = s.file_chunk("file-big", static_cast<int64_t>(pieces.size()))) pieces.push_back(*p);
    return pieces;
  };
  const std::vector<std::string> pieces = pieces_of(files);
  ASSERT_EQ(pieces.size(), 2u);
  for (const std::string& p : pieces) {
    EXPECT_LE(p.size(), kFileChunkBytes);
    EXPECT_NE(static_cast<unsigned char>(p.front()) & 0xC0, 0x80) << "a piece starts inside a character";
  }
  BatchStore again(db.string());
  EXPECT_EQ(pieces_of(again), pieces);
  const StoredFile f = files.add_file("batch", "new.jsonl", "{}\n", 6);
  EXPECT_EQ(files.file_content(f.id), std::optional<std::string>("{}\n"));
  // Listed newest first, the old rows in the order they had.
  bool more = false;
  const auto listed = files.list_files(std::nullopt, 10, std::nullopt, more);
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_EQ(listed[0].id, f.id);
  EXPECT_EQ(listed[1].id, "file-big");
  EXPECT_EQ(listed[2].id, "file-older");
  EXPECT_EQ(listed[3].id, "file-old");
}

TEST(Migration, NewerSchemaIsRefused) {
  TempDir dir;
  auto db = dir.path() / "future.db";
  ASSERT_EQ(test::exec_sql(db, "PRAGMA user_version = " +
                                   std::to_string(JobStore::schema_version_latest() + 1)),
            "");
  try {
    JobStore store(store_options(db, std::make_shared<SystemClock>()));
    FAIL() << "opened a newer schema";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("newer than this build"), std::string::npos) << e.what();
  }
}

TEST(Migration, ParserDemandsConsecutiveVersions) {
  auto ok = parse_migrations("-- @migration 1\nCREATE TABLE a (x);\n-- @migration 2\nSELECT 1;\n");
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[1].version, 2);
  EXPECT_NE(ok[0].sql.find("CREATE TABLE a"), std::string::npos);
  EXPECT_THROW(parse_migrations("-- @migration 2\nSELECT 1;\n"), Error);
  EXPECT_THROW(parse_migrations("-- @migration 1\n\n"), Error);
  EXPECT_THROW(parse_migrations("-- @migration x\nSELECT 1;\n"), Error);
  EXPECT_THROW(parse_migrations("SELECT 1;\n"), Error);
}

TEST(Migration, ShippedSchemaParses) {
  auto m = parse_migrations(jobs_schema_sql());
  EXPECT_EQ(static_cast<int>(m.size()), JobStore::schema_version_latest());
}

}  // namespace
}  // namespace moebatch
