// The real `moebatch` binary: submit (prompt and OpenAI Batch JSONL), status, result, list,
// cancel, stats, export and demo, checking exit codes, messages and the database they leave, on
// a SQLite file and on a PostgreSQL database (--db postgresql://...).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "queue/job_store.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using test::run_cli;
using test::RunResult;
using test::TempDir;

class QueueCli : public test::StoreKindTest {
 protected:
  // SQLite: a parent directory that does not exist yet, which the CLI must create.
  std::string db = postgres() ? location() : (scratch() / "nested" / "jobs.db").string();

  RunResult mb(std::vector<std::string> args) {
    args.push_back("--db");
    args.push_back(db);
    return run_cli(args);
  }
  std::string write_file(const std::string& name, const std::string& text) {
    test::write_file(scratch() / name, text);
    return (scratch() / name).string();
  }
  JobStore store() { return JobStore(test::store_options(db)); }
};

MB_INSTANTIATE_STORE_TESTS(QueueCli);

std::string chat_line(const std::string& id, const std::string& body_extra = "") {
  return R"({"custom_id":")" + id +
         R"(","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi )" +
         id + R"("}])" + body_extra + "}}\n";
}

TEST_P(QueueCli, SubmitPromptThenStatusResultCancel) {
  RunResult r = mb({"submit", "tell me a joke", "--key", "joke", "--max-tokens", "9", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  const int64_t id = j["id"];
  EXPECT_TRUE(j["created"].get<bool>());
  r = mb({"submit", "tell me a joke", "--key", "joke", "--max-tokens", "9", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["id"], id);
  EXPECT_FALSE(json::parse(r.out)["created"].get<bool>());

  r = mb({"status", "--key", "joke", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json st = json::parse(r.out);
  EXPECT_EQ(st["state"], "queued");
  EXPECT_EQ(st["sampling"]["max_tokens"], 9);
  r = mb({"status", std::to_string(id)});
  EXPECT_NE(r.out.find("job " + std::to_string(id) + ": queued"), std::string::npos) << r.out;

  r = mb({"result", std::to_string(id)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is queued: no result"), std::string::npos) << r.err;

  EXPECT_EQ(mb({"cancel", std::to_string(id)}).exit_code, 0);
  r = mb({"cancel", std::to_string(id)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already cancelled"), std::string::npos) << r.err;
  r = mb({"status", "424242"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no job with id 424242"), std::string::npos) << r.err;
}

TEST_P(QueueCli, BadPromptFlagsAreRejectedNamingTheField) {
  RunResult r = mb({"submit", "x", "--max-tokens", "-4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("max_tokens: -4"), std::string::npos) << r.err;
  // argv cannot carry 1 MiB, so the oversize prompt goes through a batch file.
  std::string file = write_file(
      "big.jsonl",
      R"({"custom_id":"big","method":"POST","url":"/v1/completions","body":{"prompt":")" +
          std::string(1048577, 'a') + "\"}}\n");
  r = mb({"submit", "--file", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("prompt: 1048577 bytes exceeds"), std::string::npos) << r.err;
  r = mb({"list", "--state", "sleeping"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--state"), std::string::npos) << r.err;
}

TEST_P(QueueCli, MalformedJsonlImportsNothingAndNamesLinesAndFields) {
  std::string text =
      chat_line("a") + chat_line("b", R"(,"max_tokens":-1)") + "\n" +
      chat_line("c", R"(,"logprobs":true)") + "{not json\n" +
      R"({"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{}})" + "\n" +
      R"({"custom_id":"f","method":"POST","url":"/v1/completions","body":{"prompt":"x"},"extra":1})" +
      "\n" + chat_line("a");
  std::string file = write_file("bad.jsonl", text);
  RunResult r = mb({"submit", "--file", file});
  EXPECT_EQ(r.exit_code, 2);
  for (const char* want :
       {"bad.jsonl:line 2: max_tokens: -1 is outside", "line 4: body.logprobs: unknown field",
        "line 5: line: not valid JSON", "line 6: url: '/v1/embeddings' is not supported",
        "line 7: extra: unknown field", "line 8: custom_id: 'a' repeats an earlier line",
        "nothing was imported"}) {
    EXPECT_NE(r.err.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.err;
  }
  EXPECT_EQ(r.err.find("line 1:"), std::string::npos) << r.err;
  EXPECT_TRUE(store().list({}).empty());
}

TEST_P(QueueCli, ImportRunExportRoundTrip) {
  std::string file = write_file(
      "batch1.jsonl",
      chat_line("q1", R"(,"max_completion_tokens":32,"stop":"END")") + chat_line("q2") +
          R"({"custom_id":"q3","method":"POST","url":"/v1/completions","body":{"prompt":"2+2=","max_tokens":3,"temperature":0}})" +
          "\n");
  RunResult r = mb({"submit", "--file", file, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json imp = json::parse(r.out);
  EXPECT_EQ(imp["batch_id"], "batch1");
  EXPECT_EQ(imp["created"], 3);
  r = mb({"submit", "--file", file, "--json"});
  EXPECT_EQ(json::parse(r.out)["existing"], 3) << "re-import must be idempotent";

  {
    JobStore s = store();
    auto jobs = s.claim("w", 3, milliseconds(60000));
    ASSERT_EQ(jobs.size(), 3u);
    for (const Job& j : jobs) {
      if (j.spec.custom_id == "q2") {
        EXPECT_EQ(s.fail("w", j.id, "context overflow", false), FailOutcome::Failed);
      } else {
        EXPECT_TRUE(s.complete("w", j.id,
                               JobResult{"answer " + *j.spec.custom_id, 5, 2, "stop", {}},
                               LatencyRecord{3, 4, 5, 12, 400.0}));
      }
      if (j.spec.custom_id == "q1") {
        EXPECT_EQ(j.spec.sampling.max_tokens, 32);
        EXPECT_EQ(j.spec.sampling.stop, std::vector<std::string>{"END"});
      }
    }
  }
  r = mb({"export", "--batch", "batch1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::map<std::string, json> by_custom;
  while (std::getline(lines, line)) {
    json j = json::parse(line);
    by_custom[j["custom_id"]] = j;
  }
  ASSERT_EQ(by_custom.size(), 3u);
  const json& q1 = by_custom["q1"];
  EXPECT_EQ(q1["response"]["status_code"], 200);
  EXPECT_TRUE(q1["error"].is_null());
  EXPECT_EQ(q1["response"]["body"]["object"], "chat.completion");
  EXPECT_EQ(q1["response"]["body"]["choices"][0]["message"]["content"], "answer q1");
  EXPECT_EQ(q1["response"]["body"]["usage"]["total_tokens"], 7);
  EXPECT_EQ(q1["response"]["body"]["model"], "m");
  EXPECT_TRUE(q1["id"].get<std::string>().rfind("batch_req_", 0) == 0);
  EXPECT_EQ(by_custom["q3"]["response"]["body"]["choices"][0]["text"], "answer q3");
  EXPECT_TRUE(by_custom["q2"]["response"].is_null());
  EXPECT_EQ(by_custom["q2"]["error"]["message"], "context overflow");

  const std::string q1_id = q1["id"].get<std::string>().substr(std::string("batch_req_").size());
  r = mb({"result", q1_id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "answer q1\n");

  r = mb({"stats", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json st = json::parse(r.out);
  EXPECT_EQ(st["counts"]["done"], 2);
  EXPECT_EQ(st["counts"]["failed"], 1);
  EXPECT_EQ(st["latency"]["total_ms"]["p50"], 12.0);
  r = mb({"list", "--batch", "batch1", "--state", "done", "--json"});
  EXPECT_EQ(json::parse(r.out).size(), 2u);
  r = mb({"export", "--batch", "nope"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST_P(QueueCli, UsageErrorsExitTwoWithAMessage) {
  ASSERT_EQ(mb({"submit", "p"}).exit_code, 0);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"status", "abc"}, "'abc' is not a decimal integer"},  // CLI11's own code was 104
      // Was clamped to INT64_MAX and looked up.
      {{"status", "99999999999999999999"}, "'99999999999999999999' is out of the 64-bit range"},
      {{"cancel", "0x1"}, "not a decimal integer"},
      {{"list", "--limit", "ten"}, "not a decimal integer"},
      {{"submit", "p", "--seed", "99999999999999999999"}, "out of the 64-bit range"},
      {{"result"}, "id is required"},
      {{"status", "1", "--no-such-flag"}, "no-such-flag"},
  };
  for (const Case& c : cases) {
    RunResult r = mb(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args[0] << " " << c.args.back() << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  // Leading zeros are decimal, not octal: job 010 is job 10.
  RunResult r = mb({"status", "010"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no job with id 10"), std::string::npos) << r.err;
  EXPECT_EQ(mb({"status", "01", "--json"}).exit_code, 0);
  EXPECT_EQ(run_cli({"--help"}).exit_code, 0);
  EXPECT_EQ(run_cli({"no-such-command"}).exit_code, 2);
}

TEST_P(QueueCli, ListAndStatusShowControlCharactersEscaped) {
  const std::string key = "k\x1b]0;owned\x07\x1b[2J";
  const std::string batch = std::string("b\r\xc2\x9b") + "31m";  // CR, then C1 CSI
  ASSERT_EQ(mb({"submit", "p", "--key", key, "--batch", batch}).exit_code, 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"list"}, std::vector<std::string>{"status", "1"}}) {
    RunResult r = mb(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << args[0];
    EXPECT_EQ(r.out.find('\r'), std::string::npos) << args[0];
    EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos) << args[0];
    EXPECT_NE(r.out.find("k\\x1b]0;owned\\x07\\x1b[2J"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("b\\x0d\\u009b31m"), std::string::npos) << r.out;
  }
  // JSON output escapes by itself and keeps the exact value.
  RunResult r = mb({"status", "1", "--json"});
  EXPECT_EQ(json::parse(r.out)["client_key"], key);
}

TEST_P(QueueCli, KeyReusedWithAnotherPayloadExitsTwo) {
  RunResult r = mb({"submit", "first prompt", "--key", "k", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int64_t id = json::parse(r.out)["id"];
  r = mb({"submit", "another prompt", "--key", "k"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already names job " + std::to_string(id) + " with a different payload"),
            std::string::npos)
      << r.err;
  r = mb({"submit", "first prompt", "--key", "k", "--max-tokens", "7"});
  EXPECT_EQ(r.exit_code, 2) << "max_tokens is part of the payload";
  r = mb({"submit", "first prompt", "--key", "k", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["created"], false);
  EXPECT_EQ(store().list({}).size(), 1u);
}

TEST(QueueCliDb, AnUnsupportedSchemeIsAUsageErrorAndCreatesNothing) {
  // The CLI runs in this process's directory, where a SQLite path "mysql://u@h/jobs" would
  // create the directory "mysql:".
  const std::filesystem::path trap = std::filesystem::current_path() / "mysql:";
  ASSERT_FALSE(std::filesystem::exists(trap));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"submit", "p"}, std::vector<std::string>{"list"},
        std::vector<std::string>{"stats"}, std::vector<std::string>{"maintenance"}}) {
    std::vector<std::string> a = args;
    a.push_back("--db");
    a.push_back("mysql://u@h/jobs");
    RunResult r = run_cli(a);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("unsupported scheme 'mysql://'"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(trap)) << "a directory was created for the URL";
  // The service side is not on PostgreSQL yet: refused with a pointer, never a SQLite file.
  test::PgTestDatabase pg;
  RunResult r = run_cli({"maintenance", "--db", pg.url()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("docs/postgres.md"), std::string::npos) << r.err;
}

TEST(QueueCliDemo, RunsToCompletionWithoutInventingOutput) {
  RunResult r =
      run_cli({"queue-demo", "--file", test::source_dir() + "/examples/demo_batch.jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Generation arrives with the engine"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rejected, it no longer holds the lease"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("invalid job row: max_tokens: -5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("== stats"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("done          1"), std::string::npos) << "demo must not complete jobs";
}

}  // namespace
}  // namespace moebatch
