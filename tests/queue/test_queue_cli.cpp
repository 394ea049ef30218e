// The real `moebatch` binary: submit (prompt and OpenAI Batch JSONL), status, result, list,
// cancel, stats, export and demo, checking exit codes, messages and the database they leave, on
// a SQLite file and on a PostgreSQL database (--db postgresql://...).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

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

TEST_P(QueueCli, StrictImportOfAMalformedFileImportsNothingAndNamesLinesAndFields) {
  std::string text =
      chat_line("a") + chat_line("b", R"(,"max_tokens":-1)") + "\n" +
      chat_line("c", R"(,"logprobs":true)") + "{not json\n" +
      R"({"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{}})" + "\n" +
      R"({"custom_id":"f","method":"POST","url":"/v1/completions","body":{"prompt":"x"},"extra":1})" +
      "\n" + chat_line("a");
  std::string file = write_file("bad.jsonl", text);
  RunResult r = mb({"submit", "--file", file, "--strict"});
  EXPECT_EQ(r.exit_code, 2);
  for (const char* want :
       {"bad.jsonl:line 2: max_tokens: -1 is outside",
        "line 4: body.logprobs: not supported by this engine (only false)",
        "line 5: line: not valid JSON", "line 6: url: '/v1/embeddings' is not supported",
        "line 7: extra: unknown field", "line 8: custom_id: 'a' repeats an earlier line",
        "nothing was imported"}) {
    EXPECT_NE(r.err.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.err;
  }
  EXPECT_EQ(r.err.find("line 1:"), std::string::npos) << r.err;
  EXPECT_TRUE(store().list({}).empty());
  EXPECT_FALSE(std::filesystem::exists(scratch() / "bad.errors.jsonl"));
}

TEST_P(QueueCli, ImportKeepsGoodLinesAndWritesBadOnesAsOpenAiErrorLines) {
  std::string file = write_file(
      "mixed.jsonl",
      chat_line("ok1", R"(,"user":"u-7","metadata":{"team":"docs"},"frequency_penalty":0)") +
          chat_line("bad1", R"(,"frequency_penalty":0.5)") +
          R"({"custom_id":"ok2","method":"POST","url":"/v1/chat/completions","body":{"messages":)"
          R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}})"
          "\n" +
          chat_line("bad2", R"(,"response_format":{"type":"json_object"})"));
  RunResult r = mb({"submit", "--file", file, "--json"});
  EXPECT_EQ(r.exit_code, 1) << "imported, but not every line: " << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["created"], 2);
  EXPECT_EQ(out["rejected"], 2);
  const std::string errors_path = (scratch() / "mixed.errors.jsonl").string();
  EXPECT_EQ(out["error_file"], errors_path);
  EXPECT_NE(r.err.find("mixed.jsonl:line 2: body.frequency_penalty: not supported"),
            std::string::npos)
      << r.err;
  std::ifstream in(errors_path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["custom_id"], "bad1");
  EXPECT_EQ(lines[0]["response"]["status_code"], 400);
  EXPECT_EQ(lines[0]["response"]["body"]["error"]["param"], "body.frequency_penalty");
  EXPECT_EQ(lines[0]["response"]["body"]["error"]["line"], 2);
  EXPECT_EQ(lines[1]["custom_id"], "bad2");
  EXPECT_EQ(lines[1]["response"]["body"]["error"]["param"], "body.response_format");
  {
    JobStore s = store();
    auto ok1 = s.get_by_key("mixed/ok1");
    ASSERT_TRUE(ok1);
    EXPECT_EQ(ok1->spec.user, "u-7");
    EXPECT_EQ(ok1->spec.metadata, R"({"team":"docs"})");
    auto ok2 = s.get_by_key("mixed/ok2");
    ASSERT_TRUE(ok2);
    EXPECT_EQ(json::parse(ok2->spec.prompt)[0]["content"], "a\nb");
  }
  // Fixed lines are imported on the next run; the good ones are not imported twice.
  write_file("mixed.jsonl", chat_line("ok1", R"(,"user":"u-7","metadata":{"team":"docs"})") +
                                chat_line("bad1") + chat_line("bad2"));
  r = mb({"submit", "--file", file, "--json", "--error-file", (scratch() / "e.jsonl").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["created"], 2);
  EXPECT_EQ(json::parse(r.out)["existing"], 1);
  EXPECT_EQ(store().list({}).size(), 4u);
  // A line whose request changed since it was imported is rejected alone; the rest goes in.
  write_file("mixed.jsonl", chat_line("ok1", R"(,"max_tokens":5)") + chat_line("new"));
  r = mb({"submit", "--file", file, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(json::parse(r.out)["created"], 1);
  EXPECT_EQ(json::parse(r.out)["rejected"], 1);
  EXPECT_NE(r.err.find("line 1: custom_id: the request differs from the one imported before"),
            std::string::npos)
      << r.err;
  // --strict refuses the same file whole, and a file with no good line is a usage error.
  write_file("mixed.jsonl", chat_line("ok1", R"(,"max_tokens":5)") + chat_line("new2"));
  EXPECT_EQ(mb({"submit", "--file", file, "--strict"}).exit_code, 2);
  EXPECT_FALSE(store().get_by_key("mixed/new2"));
  write_file("mixed.jsonl", chat_line("x", R"(,"user":1)"));
  r = mb({"submit", "--file", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no line of"), std::string::npos) << r.err;
  EXPECT_EQ(mb({"submit", "p", "--strict"}).exit_code, 2);
}

TEST_P(QueueCli, BatchVerbsFollowABatchToItsEnd) {
  std::string file = write_file("b1.jsonl", chat_line("q1") + chat_line("q2") + chat_line("q3"));
  ASSERT_EQ(mb({"submit", "--file", file}).exit_code, 0);
  int64_t done_id = 0;
  {
    JobStore s = store();
    auto jobs = s.claim("w", 2, milliseconds(60000));
    ASSERT_EQ(jobs.size(), 2u);
    done_id = jobs[0].id;
    ASSERT_TRUE(s.complete("w", jobs[0].id, {"a", 5, 2, "stop", {}}, {3, 4, 5, 12, 400.0}));
    ASSERT_EQ(s.fail("w", jobs[1].id, "boom", false), FailOutcome::Failed);
  }
  RunResult r = mb({"batch", "status", "b1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json st = json::parse(r.out);
  EXPECT_EQ(st["total"], 3);
  EXPECT_EQ(st["counts"]["done"], 1);
  EXPECT_EQ(st["counts"]["failed"], 1);
  EXPECT_EQ(st["counts"]["queued"], 1);
  EXPECT_EQ(st["completion_tokens"], 2);
  r = mb({"batch", "status", "b1"});
  EXPECT_NE(r.out.find("batch b1: 3 job(s)"), std::string::npos) << r.out;
  // status shows the done job's latency record.
  r = mb({"status", std::to_string(done_id)});
  EXPECT_NE(r.out.find("ttft         4 ms"), std::string::npos) << r.out;
  EXPECT_EQ(
      json::parse(mb({"status", std::to_string(done_id), "--json"}).out)["latency"]["total_ms"],
      12);

  r = mb({"batch", "wait", "b1", "--timeout", "1", "--interval-ms", "50"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;
  EXPECT_EQ(mb({"batch", "purge", "b1"}).exit_code, 1) << "one job is still queued";
  r = mb({"batch", "cancel", "b1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["cancelled"], 1);
  EXPECT_EQ(mb({"batch", "cancel", "b1"}).exit_code, 1) << "nothing left to cancel";
  r = mb({"batch", "wait", "b1", "--json"});
  EXPECT_EQ(r.exit_code, 1) << "finished, but one failed and one was cancelled";
  EXPECT_EQ(json::parse(r.out)["counts"]["cancelled"], 1);

  // export: done jobs in the output, failed and cancelled ones in the error file.
  const std::string out_path = (scratch() / "out.jsonl").string();
  const std::string err_path = (scratch() / "err.jsonl").string();
  ASSERT_EQ(mb({"export", "--batch", "b1", "-o", out_path, "--error-file", err_path}).exit_code, 0);
  auto count_lines = [](const std::string& p) {
    std::ifstream in(p);
    size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  EXPECT_EQ(count_lines(out_path), 1u);
  EXPECT_EQ(count_lines(err_path), 2u);

  r = mb({"batch", "retry", "b1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("requeued 1 failed job(s)"), std::string::npos) << r.out;
  EXPECT_EQ(mb({"batch", "retry", "b1"}).exit_code, 1) << "no failed job left";
  {
    JobStore s = store();
    auto jobs = s.claim("w", 5, milliseconds(60000));
    ASSERT_EQ(jobs.size(), 1u);
    ASSERT_TRUE(s.complete("w", jobs[0].id, {"b", 5, 2, "stop", {}}, {3, 4, 5, 12, 400.0}));
  }
  // A batch whose jobs all succeeded: wait exits 0.
  std::string file2 = write_file("b2.jsonl", chat_line("z"));
  ASSERT_EQ(mb({"submit", "--file", file2}).exit_code, 0);
  {
    JobStore s = store();
    auto jobs = s.claim("w", 5, milliseconds(60000));
    ASSERT_EQ(jobs.size(), 1u);
    ASSERT_TRUE(s.complete("w", jobs[0].id, {"c", 5, 2, "stop", {}}, {3, 4, 5, 12, 400.0}));
  }
  r = mb({"batch", "wait", "b2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;

  r = mb({"batch", "purge", "b1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["deleted"], 3);
  EXPECT_EQ(store().list({}).size(), 1u);
  for (const char* verb : {"status", "wait", "cancel", "retry", "purge"}) {
    r = mb({"batch", verb, "b1"});
    EXPECT_EQ(r.exit_code, 2) << verb;
    EXPECT_NE(r.err.find("no jobs in batch 'b1'"), std::string::npos) << verb << ": " << r.err;
  }
  EXPECT_EQ(mb({"batch", "status"}).exit_code, 2);
  EXPECT_EQ(mb({"batch", "frobnicate", "b2"}).exit_code, 2);
}

TEST_P(QueueCli, ListPagesPastItsLimit) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(mb({"submit", "p" + std::to_string(i)}).exit_code, 0);
  RunResult r = mb({"list", "--limit", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).size(), 2u);
  EXPECT_NE(r.err.find("next page: --after 2"), std::string::npos) << r.err;
  r = mb({"list", "--limit", "2", "--after", "4", "--json"});
  EXPECT_EQ(json::parse(r.out).size(), 1u);
  EXPECT_EQ(r.err.find("next page"), std::string::npos) << r.err;
  r = mb({"list", "--limit", "2", "--all", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json all = json::parse(r.out);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[4]["id"], 5);
  r = mb({"list", "--limit", "2", "--all"});
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 6) << "a header and 5 rows:\n" << r.out;
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

TEST_P(QueueCli, JsonOfARowNestedDeepPrintsItsText) {
  // A row written with plain SQL, nested 200,000 deep: parsed whole, printing it overflowed the
  // stack and status, result and list --json crashed.
  ASSERT_EQ(mb({"list"}).exit_code, 0);  // creates the database
  const size_t depth = 200'000;
  const std::string open = postgres() ? "repeat('[', 200000)" : "printf('%.*c', 200000, '[')";
  const std::string close = postgres() ? "repeat(']', 200000)" : "printf('%.*c', 200000, ']')";
  test::SideConnection producer(db);
  ASSERT_EQ(producer.exec("INSERT INTO jobs (prompt, prompt_kind) VALUES (" + open + " || " +
                          close + ", 'chat')"),
            "");
  const std::string prompt = std::string(depth, '[') + std::string(depth, ']');
  RunResult r = mb({"status", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
  EXPECT_EQ(json::parse(r.out)["prompt"], prompt);
  r = mb({"result", "1", "--json"});  // not done: exit 1, the job printed all the same
  EXPECT_EQ(r.exit_code, 1) << r.err.substr(0, 2000);
  EXPECT_EQ(json::parse(r.out)["prompt"], prompt);
  r = mb({"list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
  const json listed = json::parse(r.out);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["prompt"], prompt);
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

// On a terminal, batch wait draws its bar: finished / total, tokens per second and the ETA.
// util-linux's `script` gives the command a pseudo-terminal.
TEST(QueueCliWait, DrawsItsProgressBarOnATerminal) {
  if (!std::filesystem::exists("/usr/bin/script")) GTEST_SKIP() << "no /usr/bin/script";
  TempDir dir;
  const std::string db = dir.file("jobs.db");
  {
    JobStore s(test::store_options(db));
    for (const char* key : {"tty/1", "tty/2"}) {
      JobSpec spec = test::text_job("p", key);
      spec.batch_id = "tty";
      s.submit(spec);
    }
    auto jobs = s.claim("w", 2, milliseconds(60000));
    ASSERT_EQ(jobs.size(), 2u);
    ASSERT_TRUE(s.complete("w", jobs[0].id, {"a", 5, 8, "stop", {}}, {1, 2, 3, 6, 100.0}));
  }
  // The second job finishes while wait is polling.
  std::thread finisher([&] {
    std::this_thread::sleep_for(milliseconds(1200));
    JobStore s(test::store_options(db));
    auto j = s.get_by_key("tty/2");
    ASSERT_TRUE(j);
    EXPECT_TRUE(s.complete("w", j->id, {"b", 5, 8, "stop", {}}, {1, 2, 3, 6, 100.0}));
  });
  RunResult r = test::run_command(
      {"/usr/bin/script", "-q", "-e", "-c",
       test::moebatch_bin() + " batch wait tty --interval-ms 100 --db " + db, "/dev/null"});
  finisher.join();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("waiting  ["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("] 1/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("] 2/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tok/s  ETA"), std::string::npos) << r.out;
  // Without a terminal (every other test) nothing of the bar is drawn.
  r = test::run_cli({"batch", "wait", "tty", "--db", db});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err.find("waiting"), std::string::npos) << r.err;
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
  // maintenance on PostgreSQL opens the service tables there (migrating a fresh database),
  // never a SQLite file named after the URL.
  test::PgTestDatabase pg;
  RunResult r = run_cli({"maintenance", "--db", pg.url(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), json::array()) << r.out;
  r = run_cli({"maintenance", "--now", "--db", pg.url(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["request"], 1) << r.out;
  test::PgSqlConnection side(pg.url());
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM service_requests WHERE taken_at IS NULL"), 1);
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
