// Rows inserted with plain SQL by an external producer (schemas/README.md): the documented
// example works verbatim on both databases, invalid rows become failed with a reason naming the
// column, and the database constraints reject what the contract says they reject
// (producer-chosen ids included; PostgreSQL's own id rules are in test_pg_store.cpp).
#include <gtest/gtest.h>

#include <thread>

#include "common/json_parse.h"
#include "queue/job_json.h"
#include "queue/job_row.h"
#include "queue/job_store.h"
#include "queue/schema.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::store_options;
using test::TempDir;

class ExternalRowsTest : public test::StoreKindTest {
 protected:
  std::shared_ptr<SystemClock> clock = std::make_shared<SystemClock>();
  JobStore store{store_options(location(), clock)};
  // A separate raw connection, as an external producer has.
  test::SideConnection producer{location()};

  // SQL for `n` copies of `piece` (a few ASCII characters without quotes), in either dialect.
  std::string repeat_sql(const std::string& piece, size_t n) const {
    const std::string count = std::to_string(n);
    if (postgres()) return "repeat('" + piece + "', " + count + ")";
    return "replace(printf('%.*c', " + count + ", '~'), '~', '" + piece + "')";
  }
};

MB_INSTANTIATE_STORE_TESTS(ExternalRowsTest);

// The SQLite-only rules (type affinity, AUTOINCREMENT ids, INSERT OR ...).
class SqliteExternalRowsTest : public ::testing::Test {
 protected:
  TempDir dir;
  std::filesystem::path db = dir.path() / "jobs.db";
  JobStore store{store_options(db)};
  test::SqlConnection producer{db};
};

TEST(ExternalRows, DocumentedExampleIsInTheReadmeVerbatim) {
  const std::string readme = test::read_file(test::source_dir() + "/schemas/README.md");
  ASSERT_FALSE(readme.empty()) << "schemas/README.md not found";
  EXPECT_NE(readme.find(std::string(external_insert_example_sql())), std::string::npos)
      << "schemas/README.md no longer contains example_external_insert.sql verbatim";
}

TEST_P(ExternalRowsTest, DocumentedExampleRowsAreClaimedAsFirstClassJobs) {
  ASSERT_EQ(producer.exec(std::string(external_insert_example_sql())), "");
  auto got = store.claim("w", 10, milliseconds(60000));
  ASSERT_EQ(got.size(), 2u);
  // priority 5 first
  EXPECT_EQ(got[0].spec.client_key, "nightly-report-0002");
  EXPECT_EQ(got[0].spec.prompt_kind, PromptKind::Chat);
  EXPECT_EQ(got[0].spec.sampling.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(got[0].spec.sampling.max_tokens, 64);
  EXPECT_EQ(got[1].spec.client_key, "nightly-report-0001");
  EXPECT_DOUBLE_EQ(got[1].spec.sampling.temperature, 0.7);
  EXPECT_EQ(got[1].spec.sampling.top_k, 0);
  EXPECT_EQ(got[1].spec.max_attempts, 3);
  EXPECT_GT(got[1].enqueued_at, 1'600'000'000'000) << "default enqueued_at is not epoch ms";
  EXPECT_LE(got[1].enqueued_at, clock->now_ms());
}

TEST_P(ExternalRowsTest, InvalidRowsFailWithReasonAndValidOnesAreClaimed) {
  struct Case {
    std::string values;  // (prompt, prompt_kind, max_tokens, temperature, stop, attempts)
    std::string reason;
  };
  std::vector<Case> bad = {
      {"'p', 'text', -5, 1.0, NULL, 0", "max_tokens: -5 is outside"},
      {"'p', 'image', 10, 1.0, NULL, 0", "prompt_kind: 'image'"},
      {"'[{\"role\":\"user\"}]', 'chat', 10, 1.0, NULL, 0", "messages[0].content"},
      {"'{oops', 'chat', 10, 1.0, NULL, 0", "prompt: chat messages are not valid JSON"},
      {"'p', 'text', 10, 9.0, NULL, 0", "temperature"},
      {"'p', 'text', 10, 1.0, '\"END\"', 0", "stop: must be a JSON array"},
      // a number beyond double: nlohmann's out_of_range, which used to escape the claim
      {"'p', 'text', 10, 1.0, '[1e999]', 0", "stop: must be a JSON array"},
      {"'[{\"role\": \"user\", \"content\": \"x\", \"n\": 1e999}]', 'chat', 10, 1.0, NULL, 0",
       "prompt: chat messages are not valid JSON"},
      {"'', 'text', 10, 1.0, NULL, 0", "prompt: must not be empty"},
      {"'p', 'text', 10, 1.0, NULL, 3", "attempts: 3 already reaches max_attempts 3"},
  };
  if (postgres()) {
    // Typed columns refuse 'lots' and blobs at INSERT time (test_pg_store.cpp).
    bad.push_back({"repeat('a', 1048577), 'text', 10, 1.0, NULL, 0", "prompt: 1048577 bytes"});
  } else {
    bad.push_back(
        {"'p', 'text', 'lots', 1.0, NULL, 0", "max_tokens: expected an integer, found text"});
    bad.push_back({"x'00ff', 'text', 10, 1.0, NULL, 0", "prompt: expected text, found blob"});
    bad.push_back(
        {"printf('%.*c', 1048577, 'a'), 'text', 10, 1.0, NULL, 0", "prompt: 1048577 bytes"});
  }
  std::string sql = postgres() ? "BEGIN;" : "BEGIN IMMEDIATE;";
  for (size_t i = 0; i < bad.size(); ++i) {
    sql +=
        "INSERT INTO jobs (client_key, prompt, prompt_kind, max_tokens, temperature, stop, "
        "attempts) VALUES ('bad" +
        std::to_string(i) + "', " + bad[i].values + ");";
    sql += "INSERT INTO jobs (client_key, prompt) VALUES ('good" + std::to_string(i) + "', 'ok');";
  }
  sql += "COMMIT;";
  ASSERT_EQ(producer.exec(sql), "");

  auto got = store.claim("w", 1000, milliseconds(60000));
  ASSERT_EQ(got.size(), bad.size());
  for (const Job& j : got) EXPECT_EQ(j.spec.client_key->rfind("good", 0), 0u) << *j.spec.client_key;
  for (size_t i = 0; i < bad.size(); ++i) {
    auto j = store.get_by_key("bad" + std::to_string(i));
    ASSERT_TRUE(j);
    EXPECT_EQ(j->state, JobState::Failed) << bad[i].reason;
    EXPECT_TRUE(j->finished_at.has_value());
    ASSERT_TRUE(j->error.has_value());
    EXPECT_NE(j->error->find("invalid job row: "), std::string::npos) << *j->error;
    EXPECT_NE(j->error->find(bad[i].reason), std::string::npos)
        << "expected '" << bad[i].reason << "' in '" << *j->error << "'";
  }
  EXPECT_EQ(store.stats().counts[JobState::Failed], static_cast<int64_t>(bad.size()));
}

TEST_P(ExternalRowsTest, ABadPromptKindIsQuotedInShortAndClaimingGoesOn) {
  // The failed row's error quotes the kind: whole, a huge kind made the UPDATE writing it too big
  // (near SQLite's 1 GB limit), rolled the claim back and came first again every tick.
  const std::string straddling = std::string(31, 'a') + "\xc3\xa9" + std::string(20, 'b');
  ASSERT_EQ(
      producer.exec("INSERT INTO jobs (client_key, prompt, prompt_kind) VALUES ('huge', 'p', " +
                    repeat_sql("x", 4 << 20) + ")"),
      "");
  ASSERT_EQ(producer.exec("INSERT INTO jobs (client_key, prompt, prompt_kind) VALUES "
                          "('cut', 'p', '" +
                          straddling + "'), ('good', 'ok', 'text')"),
            "");
  auto got = store.claim("w", 10, milliseconds(60000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].spec.client_key, "good");

  auto huge = store.get_by_key("huge");
  ASSERT_TRUE(huge && huge->error);
  EXPECT_EQ(huge->state, JobState::Failed);
  EXPECT_LT(huge->error->size(), 200u);
  EXPECT_NE(huge->error->find("prompt_kind: a 4194304-byte value is not one of text|chat"),
            std::string::npos)
      << huge->error->substr(0, 200);

  // Cut at 32 bytes, before the character that straddles them: still valid UTF-8.
  auto cut = store.get_by_key("cut");
  ASSERT_TRUE(cut && cut->error);
  EXPECT_EQ(cut->state, JobState::Failed);
  EXPECT_NE(cut->error->find("prompt_kind: '" + std::string(31, 'a') + "…' is not one of"),
            std::string::npos)
      << *cut->error;
  EXPECT_EQ(cut->error->find("bbb"), std::string::npos) << *cut->error;
  EXPECT_TRUE(is_valid_utf8(*cut->error));
}

TEST_P(ExternalRowsTest, AStopListTooLongToBeValidIsRefusedUnparsedAndFailsOnlyItsRow) {
  // 400,001 empty strings: parsed whole, they became that many strings before the 8-stop limit
  // was checked (a 100 MB value, millions). The text is measured first.
  const size_t n = 400'000;
  ASSERT_EQ(
      producer.exec("INSERT INTO jobs (client_key, prompt, stop) VALUES ('many', 'p', '[' || " +
                    repeat_sql("\"\",", n) + " || '\"\"]')"),
      "");
  // The longest list that can be valid is still read: 8 stops of 256 bytes, each escaped.
  std::string escaped;
  for (int i = 0; i < 256; ++i) escaped += "\\u0041";
  std::string longest = "[";
  for (int i = 0; i < 8; ++i) longest += std::string(i ? ", " : "") + "\"" + escaped + "\"";
  longest += "]";
  ASSERT_LE(longest.size(), stored_stop_max_bytes(JobLimits{}));
  ASSERT_EQ(producer.exec("INSERT INTO jobs (client_key, prompt, stop) VALUES ('longest', 'p', '" +
                          longest + "')"),
            "");

  const size_t bytes = 2 + 3 * n + 2;
  const std::string limit = std::to_string(stored_stop_max_bytes(JobLimits{}));
  auto listed = store.list({});
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_TRUE(listed[0].spec.sampling.stop.empty()) << "the list was parsed";
  ASSERT_EQ(listed[1].spec.sampling.stop.size(), 8u);
  EXPECT_EQ(listed[1].spec.sampling.stop[0], std::string(256, 'A'));

  auto got = store.claim("w", 10, milliseconds(60000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].spec.client_key, "longest");
  auto many = store.get_by_key("many");
  ASSERT_TRUE(many && many->error);
  EXPECT_EQ(many->state, JobState::Failed);
  EXPECT_NE(many->error->find("invalid job row: stop: " + std::to_string(bytes) +
                              " bytes exceeds the limit of " + limit),
            std::string::npos)
      << *many->error;
}

TEST_P(ExternalRowsTest, OversizedTextColumnsAreMeasuredBeforeTheyAreCopied) {
  // Over the limits, a column is not read at all: get and list leave it out, a claim fails the
  // row naming it (in the words validation uses).
  const JobLimits limits;
  ASSERT_EQ(producer.exec("INSERT INTO jobs (custom_id, model, prompt, metadata) VALUES (" +
                          repeat_sql("c", 1 << 20) + ", 'm', " +
                          repeat_sql("p", limits.max_prompt_bytes + 1) + ", '{\"k\":\"' || " +
                          repeat_sql("v", 1 << 20) + " || '\"}')"),
            "");
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt, prompt_kind, chat_template_kwargs) VALUES "
                          "('[{\"role\":\"user\",\"content\":\"hi\"}]', 'chat', '{\"a\":\"' || " +
                          repeat_sql("k", limits.max_template_kwargs_bytes) + " || '\"}')"),
            "");
  auto listed = store.list({});
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_FALSE(listed[0].spec.custom_id.has_value());
  EXPECT_EQ(listed[0].spec.model, "m");
  EXPECT_TRUE(listed[0].spec.prompt.empty());
  EXPECT_FALSE(listed[0].spec.metadata.has_value());
  EXPECT_FALSE(listed[1].spec.chat_template_kwargs.has_value());
  EXPECT_EQ(listed[1].spec.prompt_kind, PromptKind::Chat);

  EXPECT_TRUE(store.claim("w", 10, milliseconds(60000)).empty());
  auto first = store.get(listed[0].id);
  ASSERT_TRUE(first && first->error);
  EXPECT_NE(first->error->find("invalid job row: custom_id: 1048576 bytes exceeds the limit of " +
                               std::to_string(limits.max_id_bytes)),
            std::string::npos)
      << *first->error;
  auto second = store.get(listed[1].id);
  ASSERT_TRUE(second && second->error);
  EXPECT_NE(second->error->find(
                "chat_template_kwargs: " + std::to_string(limits.max_template_kwargs_bytes + 8) +
                " bytes exceeds the limit of " + std::to_string(limits.max_template_kwargs_bytes)),
            std::string::npos)
      << *second->error;
}

TEST_P(ExternalRowsTest, StoredJsonNestedPastTheBoundIsShownAsItsText) {
  // job_to_json (status, result and list --json, the ZeroMQ and HTTP replies) parses a chat
  // prompt, metadata and chat_template_kwargs: nested too deep, each is shown as the raw text.
  auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  const std::string prompt = nested(5000), metadata = nested(1000), kwargs = nested(1000);
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt, prompt_kind, metadata, chat_template_kwargs) "
                          "VALUES ('" +
                          prompt + "', 'chat', '" + metadata + "', '" + kwargs + "')"),
            "");
  auto check = [&](const Job& j) {
    const nlohmann::json out = job_to_json(j);
    EXPECT_EQ(out["prompt"], prompt);
    EXPECT_EQ(out["metadata"], metadata);
    EXPECT_EQ(out["chat_template_kwargs"], kwargs);
    EXPECT_FALSE(dump_json(out).empty());
  };
  auto listed = store.list({});
  ASSERT_EQ(listed.size(), 1u);
  check(listed[0]);
  // Claimed, it fails (metadata is not an object), and stays in the table to be shown.
  EXPECT_TRUE(store.claim("w", 10, milliseconds(60000)).empty());
  auto failed = store.get(listed[0].id);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->state, JobState::Failed);
  check(*failed);
  // Within the bound, stored JSON is still shown as JSON.
  Job shallow = *failed;
  shallow.spec.metadata = R"({"team":"x"})";
  EXPECT_EQ(job_to_json(shallow)["metadata"]["team"], "x");
}

TEST_P(ExternalRowsTest, ConstraintsRejectWhatTheContractSays) {
  // The two databases word their refusals differently.
  const std::string not_null = postgres() ? "not-null" : "NOT NULL";
  const std::string check = postgres() ? "check constraint" : "CHECK";
  const std::string unique = postgres() ? "duplicate key" : "UNIQUE";
  EXPECT_NE(producer.exec("INSERT INTO jobs (prompt) VALUES (NULL)").find(not_null),
            std::string::npos);
  EXPECT_NE(producer.exec("INSERT INTO jobs (prompt, state) VALUES ('p', 'bogus')").find(check),
            std::string::npos);
  ASSERT_EQ(producer.exec("INSERT INTO jobs (client_key, prompt) VALUES ('k', 'p')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (client_key, prompt) VALUES ('k', 'p')").find(unique),
            std::string::npos);
  EXPECT_EQ(producer.exec(
                postgres() ? "INSERT INTO jobs (client_key, prompt) VALUES ('k', 'p') "
                             "ON CONFLICT (client_key) DO NOTHING"
                           : "INSERT OR IGNORE INTO jobs (client_key, prompt) VALUES ('k', 'p')"),
            "");
  EXPECT_EQ(store.list({}).size(), 1u);
}

TEST_F(SqliteExternalRowsTest, ProducerChosenIdsAreRefusedAndSubmitsGoOn) {
  // The last id AUTOINCREMENT can hand out: taking it made every later INSERT fail.
  const std::string err =
      producer.exec("INSERT INTO jobs (id, prompt) VALUES (9223372036854775807, 'p')");
  EXPECT_NE(err.find("jobs.id is assigned by the queue"), std::string::npos) << err;
  EXPECT_NE(producer.exec("INSERT OR IGNORE INTO jobs (id, prompt) VALUES (5, 'p')"), "");
  EXPECT_NE(producer.exec("INSERT OR REPLACE INTO jobs (id, prompt) VALUES (5, 'p')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (rowid, prompt) VALUES (5, 'p')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) VALUES (-1, 'p')"), "");
  EXPECT_NE(producer.exec("INSERT INTO jobs (id, prompt) VALUES (0, 'p')"), "");
  EXPECT_EQ(store.list({}).size(), 0u);
  // Leaving id out (or NULL) is the contract; the queue's own submits go on too.
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt) VALUES ('p')"), "");
  ASSERT_EQ(producer.exec("INSERT INTO jobs (id, prompt) VALUES (NULL, 'p')"), "");
  EXPECT_EQ(store.submit(test::text_job("after")).id, 3);
  EXPECT_NE(producer.exec("UPDATE jobs SET id = 9223372036854775807 WHERE id = 1"), "");
  EXPECT_EQ(store.submit(test::text_job("and after")).id, 4);
  EXPECT_EQ(producer.query_i64("SELECT max(id) FROM jobs"), 4);
}

TEST_P(ExternalRowsTest, DataVersionRevealsExternalInserts) {
  int64_t v0 = store.data_version();
  EXPECT_EQ(store.data_version(), v0);
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt) VALUES ('p')"), "");
  int64_t v1 = store.data_version();
  for (int i = 0; i < 200 && v1 == v0; ++i) {  // a NOTIFY arrives a moment after the commit
    std::this_thread::sleep_for(milliseconds(5));
    v1 = store.data_version();
  }
  EXPECT_NE(v1, v0);
}

}  // namespace
}  // namespace moebatch
