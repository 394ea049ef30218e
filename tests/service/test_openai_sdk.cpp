// The OpenAI-compatible API driven by a real client: the official OpenAI SDK for Node
// (tests/service/openai, installed into the build tree by CMake with `npm ci`) against a real
// `moebatch serve` process on the demo model (CPU backend), with an API key file. The script
// checks models, chat and completions whole and streamed, typed errors, aborts a stream, and
// runs the Batch API round trip (upload, create, poll, output and error files, cancel, a bad
// file); this test then checks the queue: the aborted job is cancelled and its slot free, every
// other request is a done high-priority job with a latency row, the batches' requests are
// ordinary jobs. A second test kills the daemon mid-batch and checks nothing is lost or redone.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

#if defined(MOEBATCH_NODE) && defined(OPENAI_CLIENT_DIR)

TEST(OpenAiSdk, NodeClientListsModelsChatsCompletesStreamsAndAborts) {
  if (!std::filesystem::exists(std::string(OPENAI_CLIENT_DIR) +
                               "/node_modules/openai/package.json"))
    GTEST_SKIP() << "the OpenAI SDK is not installed in " << OPENAI_CLIENT_DIR
                 << " (the build's `npm ci` failed: see the build log)";
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db";
  const auto ready = dir.path() / "ready.json";
  test::write_file(dir.path() / "keys", "sk-moebatch-test-1\n");
  test::Child serve(
      test::join_args({{test::moebatch_bin(), "serve", "--db", db.string()},
                       test::demo_model_flags(),
                       {"--api-key-file", dir.file("keys"), "--bind", "tcp://127.0.0.1:*", "--port",
                        "0", "--ready-file", ready.string()},
                       test::small_engine_flags(4),
                       {"--poll-ms", "10"}}),
      dir.path() / "serve.log");
  const auto info = test::wait_ready(ready, 60s);
  ASSERT_TRUE(info) << serve.read_log();
  const int port = (*info)["http_port"].get<int>();
  const std::string base = "http://127.0.0.1:" + std::to_string(port) + "/v1";

  const auto run =
      test::run_command({MOEBATCH_NODE, std::string(OPENAI_CLIENT_DIR) + "/sdk_test.mjs", base,
                         "sk-moebatch-test-1", "demo"},
                        120s);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err << serve.read_log();
  const std::string last = run.out.substr(run.out.rfind('{'));
  const auto result = nlohmann::json::parse(last);
  ASSERT_TRUE(result["ok"].get<bool>()) << run.out;
  const std::string aborted = result["aborted_id"];
  const std::string job = aborted.substr(aborted.rfind('-') + 1);

  // The abandoned stream's job is cancelled and leaves the engine; nothing else is running.
  EXPECT_TRUE(test::wait_until(
      [&] {
        return test::query_text(db, "SELECT state FROM jobs WHERE id = " + job) == "cancelled";
      },
      10s))
      << serve.read_log();
  EXPECT_TRUE(test::wait_until(
      [&] {
        const auto m = test::http_request(port, "GET", "/metrics").body;
        return test::metric_value(m, "moebatch_engine_active_sequences") == 0 &&
               test::metric_value(m, "moebatch_in_flight_jobs") == 0;
      },
      10s));
  // Every other request: a done job at API priority with a latency row (3 chat + 2 completion);
  // refused requests queued nothing.
  EXPECT_EQ(test::query_i64(db,
                            "SELECT count(*) FROM jobs WHERE state = 'done' AND priority = "
                            "1000 AND batch_id = 'openai-api'"),
            5);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM jobs WHERE batch_id = 'openai-api'"), 6);
  // The batch's requests are ordinary jobs of the queue, at batch priority, each run once.
  const std::string batch = result["batch_id"];
  const std::string of_batch = "FROM jobs WHERE batch_id = '" + batch + "'";
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) " + of_batch + " AND state = 'done'"), 6);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) " + of_batch + " AND state = 'failed'"), 1);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) " + of_batch + " AND priority = 0"), 7);
  EXPECT_EQ(test::query_i64(db,
                            "SELECT count(*) FROM jobs WHERE state = 'cancelled' AND "
                            "client_key LIKE 'batch_%/long-%'"),
            3);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM job_latency"), 11);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM jobs WHERE attempts > 1"), 0);

  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_for(30s), 0) << serve.read_log();
  EXPECT_NE(serve.read_log().find("bearer keys from"), std::string::npos);
}

#else

TEST(OpenAiSdk, NodeClientListsModelsChatsCompletesStreamsAndAborts) {
  GTEST_SKIP() << "node and npm were not found when the build was configured "
                  "(scripts/deps.sh installs them)";
}

#endif

// A daemon killed (SIGKILL) in the middle of a batch: the next incarnation finishes it. Nothing
// is lost (every request has exactly one line in the output file) and nothing finished is redone
// (requests done before the kill keep their result and finish time, and ran once).
TEST(OpenAiBatch, KilledMidBatchTheNextDaemonFinishesItWithoutRedoingFinishedRequests) {
  MB_SKIP_UNDER_TSAN("four requests must finish before the kill");
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db";
  const auto ready = dir.path() / "ready.json";
  auto start = [&](int n) {
    std::filesystem::remove(ready);
    return test::Child(test::join_args({{SERVICE_DAEMON_BIN, "--db", db.string()},
                                        test::demo_model_flags(),
                                        {"--port", "0", "--ready-file", ready.string()},
                                        test::small_engine_flags(2),
                                        {"--poll-ms", "10", "--lease-s", "2"}}),
                       dir.path() / ("daemon" + std::to_string(n) + ".log"));
  };
  test::Child first = start(0);
  auto info = test::wait_ready(ready, 60s);
  ASSERT_TRUE(info) << first.read_log();
  int port = (*info)["http_port"].get<int>();

  constexpr int kRequests = 16;
  std::string jsonl;
  for (int i = 0; i < kRequests; ++i) {
    jsonl += nlohmann::json({{"custom_id", "r" + std::to_string(i)},
                             {"method", "POST"},
                             {"url", "/v1/completions"},
                             {"body",
                              {{"model", "demo"},
                               {"prompt", "Item " + std::to_string(i)},
                               {"max_tokens", 96},
                               {"temperature", 0}}}})
                 .dump() +
             "\n";
  }
  const std::string body =
      "--B0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
      "batch\r\n--B0undary\r\nContent-Disposition: form-data; name=\"file\"; "
      "filename=\"r.jsonl\"\r\n\r\n" +
      jsonl + "\r\n--B0undary--\r\n";
  const auto file =
      test::http_request(port, "POST", "/v1/files", body,
                         {{"Content-Type", "multipart/form-data; boundary=B0undary"}});
  ASSERT_EQ(file.status, 200) << file.body;
  const std::string file_id = nlohmann::json::parse(file.body)["id"];
  const auto created = test::http_request(port, "POST", "/v1/batches",
                                          nlohmann::json({{"input_file_id", file_id},
                                                          {"endpoint", "/v1/completions"},
                                                          {"completion_window", "24h"}})
                                              .dump());
  ASSERT_EQ(created.status, 200) << created.body;
  const std::string batch = nlohmann::json::parse(created.body)["id"];
  const std::string of_batch = "FROM jobs WHERE batch_id = '" + batch + "'";

  // Kill it once some requests are done and others are running.
  ASSERT_TRUE(test::wait_until(
      [&] {
        return test::query_i64(db, "SELECT count(*) " + of_batch + " AND state = 'done'") >= 4;
      },
      30s));
  first.signal(SIGKILL);
  EXPECT_EQ(first.wait_for(10s), -SIGKILL);
  const int64_t done_before =
      test::query_i64(db, "SELECT count(*) " + of_batch + " AND state = 'done'");
  ASSERT_LT(done_before, kRequests) << "the batch finished before the kill";
  const std::string done_ids =
      test::query_text(db, "SELECT group_concat(id) " + of_batch + " AND state = 'done'");
  auto results_of_done = [&] {
    return test::query_text(
        db,
        "SELECT group_concat(id || ':' || finished_at || ':' || result_text || ':' || "
        "attempts, '|') FROM jobs WHERE id IN (" +
            done_ids + ")");
  };
  const std::string snapshot = results_of_done();

  test::Child second = start(1);
  info = test::wait_ready(ready, 60s);
  ASSERT_TRUE(info) << second.read_log();
  port = (*info)["http_port"].get<int>();
  nlohmann::json b;
  ASSERT_TRUE(test::wait_until(
      [&] {
        b = nlohmann::json::parse(test::http_request(port, "GET", "/v1/batches/" + batch).body,
                                  nullptr, false);
        return b.is_object() && b.value("status", "") == "completed";
      },
      60s))
      << b.dump() << second.read_log();
  EXPECT_EQ(b["request_counts"]["completed"], kRequests);
  const auto out = test::http_request(
      port, "GET", "/v1/files/" + b["output_file_id"].get<std::string>() + "/content");
  ASSERT_EQ(out.status, 200);
  std::set<std::string> ids;
  size_t n = 0;
  for (size_t p = 0; p < out.body.size(); p = out.body.find('\n', p) + 1) {
    ids.insert(nlohmann::json::parse(out.body.substr(p, out.body.find('\n', p) - p))["custom_id"]
                   .get<std::string>());
    ++n;
  }
  EXPECT_EQ(n, static_cast<size_t>(kRequests));
  EXPECT_EQ(ids.size(), static_cast<size_t>(kRequests));
  // What was done before the kill is untouched: same rows, same results, same finish times.
  EXPECT_EQ(results_of_done(), snapshot);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM job_latency WHERE job_id IN (SELECT id " +
                                    of_batch + ")"),
            kRequests);
  second.signal(SIGTERM);
  EXPECT_EQ(second.wait_for(30s), 0) << second.read_log();
}

}  // namespace
}  // namespace moebatch
