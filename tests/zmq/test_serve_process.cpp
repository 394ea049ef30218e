// The real `moebatch serve --no-engine` process: killed between receiving a submit and
// committing it (and between committing and replying), a Lazy-Pirate client that retries with
// the same key ends with the job in the database exactly once. Also: SIGTERM stops it cleanly,
// and the default frame limit sits just above the request limit.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>

#include "queue/zmq/client.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/queue/queue_test_util.h"
#include "tests/zmq/zmq_test_util.h"

namespace moebatch {
namespace {

using nlohmann::json;
using test::Child;
using test::TempDir;
namespace zi = moebatch::zmq_ingress;

/// Starts serve on bind and waits for its ready line; returns the ROUTER endpoint.
std::unique_ptr<Child> start_serve(const std::filesystem::path& db, const std::string& bind,
                                   const std::string& crash, std::string* endpoint,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {test::moebatch_bin(), "serve", "--no-engine"};
  argv.insert(argv.end(), {"--db", db.string(), "--bind", bind});
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!crash.empty()) {
    argv.push_back("--test-crash");
    argv.push_back(crash);
  }
  auto child = std::make_unique<Child>(argv);
  const std::string line = child->read_line(20000);
  json ready = json::parse(line, nullptr, false);
  if (ready.is_discarded() || !ready.contains("router")) {
    ADD_FAILURE() << "serve did not get ready: '" << line << "'";
    return child;
  }
  *endpoint = ready["router"].get<std::string>();
  return child;
}

void crash_and_retry(const std::string& crash_point) {
  TempDir dir;
  const auto db = dir.path() / "jobs.db";
  std::string endpoint;
  auto first = start_serve(db, "tcp://127.0.0.1:*", crash_point, &endpoint);
  ASSERT_FALSE(endpoint.empty());
  // The client keeps retrying the same request on the same endpoint while we restart it.
  auto submitted = std::async(std::launch::async, [endpoint] {
    zi::ClientOptions o;
    o.endpoint = endpoint;
    o.timeout = std::chrono::milliseconds(500);
    o.attempts = 40;
    zi::LazyPirateClient client(o);
    JobSpec s = test::text_job("survive the crash", "crash-key");
    auto r = client.submit_jobs({s});
    return std::make_pair(r, client.sends());
  });
  const int status = first->wait();
  ASSERT_GE(status, 0) << "killed by signal " << -status;
  EXPECT_EQ(status, 86) << "the crash hook did not fire";
  std::string endpoint2;
  auto second = start_serve(db, endpoint, "", &endpoint2);
  ASSERT_EQ(endpoint2, endpoint);
  auto [results, sends] = submitted.get();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_GE(sends, 2);
  // Committed before the crash: the retry finds it (created=false); otherwise it creates it.
  EXPECT_EQ(results[0].created, crash_point == "before-commit");
  JobStore store(test::store_options(db));
  EXPECT_EQ(store.list({}).size(), 1u);
  auto job = store.get_by_key("crash-key");
  ASSERT_TRUE(job);
  EXPECT_EQ(job->id, results[0].id);
  second->signal(SIGTERM);
  EXPECT_EQ(second->wait(), 0);
}

TEST(ServeProcess, KilledBeforeCommitClientRetryCreatesTheJobOnce) {
  crash_and_retry("before-commit");
}

TEST(ServeProcess, KilledAfterCommitClientRetryGetsTheSameJob) { crash_and_retry("after-commit"); }

TEST(ServeProcess, SigintStopsCleanlyAndBadFlagsAreRefused) {
  TempDir dir;
  std::string endpoint;
  auto serve = start_serve(dir.path() / "jobs.db", "tcp://127.0.0.1:*", "", &endpoint);
  ASSERT_FALSE(endpoint.empty());
  zi::ClientOptions o;
  o.endpoint = endpoint;
  zi::LazyPirateClient client(o);
  EXPECT_EQ(client.call({{"v", 1}, {"cmd", "stats"}})["ok"], true);
  serve->signal(SIGINT);
  EXPECT_EQ(serve->wait(), 0);

  auto r = test::run_cli({"serve", "--db", dir.file("x.db")});
  EXPECT_EQ(r.exit_code, 2) << "serve with the engine needs --model: " << r.err;
  r = test::run_cli({"serve", "--no-engine", "--db", dir.file("x.db"), "--curve-secret",
                     "/nonexistent", "--curve-clients", "/nonexistent"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
}

// --max-message-bytes defaults to 64 KiB over --max-request-bytes: a body a little over the
// request limit is still answered too_large, a frame past the headroom drops the connection
// before libzmq holds it (docs/zmq.md, Limits), and the daemon goes on serving.
TEST(ServeProcess, MessageLimitDefaultsJustAboveTheRequestLimit) {
  TempDir dir;
  std::string endpoint;
  auto serve = start_serve(dir.path() / "jobs.db", "tcp://127.0.0.1:*", "", &endpoint,
                           {"--max-request-bytes", "65536"});
  ASSERT_FALSE(endpoint.empty());
  zmq::context_t ctx;
  test::Peer peer(ctx, endpoint);
  peer.send_frames({std::string((64 << 10) + 1000, ' ')});
  EXPECT_EQ(peer.recv()["error"]["code"], "too_large");
  test::Peer huge(ctx, endpoint);
  huge.send_frames({std::string((64 << 10) + (128 << 10), ' ')});
  EXPECT_FALSE(huge.recv_frames(1000).has_value()) << "a frame over the default limit was read";
  EXPECT_EQ(peer.call({{"v", 1}, {"cmd", "stats"}, {"id", 1}})["ok"], true);
  serve->signal(SIGTERM);
  EXPECT_EQ(serve->wait(), 0);
}

TEST(ServeProcess, CliSubmitThroughEndpointIsIdempotentAndHonoursCurve) {
  TempDir dir;
  const std::string d = dir.path().string();
  for (const char* who : {"server", "client", "stranger"}) {
    ASSERT_EQ(test::run_cli({"keygen", d + "/" + who}).exit_code, 0);
  }
  std::filesystem::copy_file(dir.path() / "client.pub", dir.path() / "clients.txt");
  std::string endpoint;
  auto serve =
      start_serve(dir.path() / "jobs.db", "tcp://127.0.0.1:*", "", &endpoint,
                  {"--curve-secret", d + "/server.key", "--curve-clients", d + "/clients.txt"});
  ASSERT_FALSE(endpoint.empty());
  auto submit = [&](const std::string& secret) {
    return test::run_cli({"submit", "hello over zmq", "--key", "cli-1", "--max-tokens", "9",
                          "--json", "--endpoint", endpoint, "--curve-server-key", d + "/server.pub",
                          "--curve-secret", d + "/" + secret + ".key", "--attempts", "2",
                          "--timeout-ms", "400"});
  };
  auto first = submit("client");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  json a = json::parse(first.out);
  EXPECT_EQ(a["created"], true);
  auto again = submit("client");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  json b = json::parse(again.out);
  EXPECT_EQ(b["id"], a["id"]);
  EXPECT_EQ(b["created"], false);
  auto refused = submit("stranger");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("giving up"), std::string::npos) << refused.err;
  serve->signal(SIGTERM);
  serve->wait();
  JobStore store(test::store_options(dir.path() / "jobs.db"));
  auto job = store.get_by_key("cli-1");
  ASSERT_TRUE(job);
  EXPECT_EQ(job->spec.prompt, "hello over zmq");
  EXPECT_EQ(job->spec.sampling.max_tokens, 9);
  EXPECT_EQ(store.list({}).size(), 1u);
}

// A remote producer's whole batch over the endpoint: a forgiving file import in chunks, then
// status, wait, cancel, retry and purge, each checked against the database behind the ingress.
TEST(ServeProcess, BatchFileAndBatchVerbsThroughTheEndpoint) {
  TempDir dir;
  const auto db = dir.path() / "jobs.db";
  std::string endpoint;
  auto serve = start_serve(db, "tcp://127.0.0.1:*", "", &endpoint);
  ASSERT_FALSE(endpoint.empty());
  auto line = [](const std::string& id, const std::string& extra) {
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"prompt":"p )" + id + "\"" + extra +
           "}}\n";
  };
  const std::string file = dir.file("remote.jsonl");
  test::write_file(file, line("a", "") + line("b", R"(,"user":"u")") +
                             line("c", R"(,"best_of":3)") + line("d", ""));
  auto mb = [&](std::vector<std::string> args) {
    args.insert(args.end(), {"--endpoint", endpoint, "--timeout-ms", "2000"});
    return test::run_cli(args);
  };
  auto r = mb({"submit", "--file", file, "--json"});
  ASSERT_EQ(r.exit_code, 1) << "one line rejected: " << r.err;
  json imp = json::parse(r.out);
  EXPECT_EQ(imp["created"], 3);
  EXPECT_EQ(imp["rejected"], 1);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "remote.errors.jsonl"));
  r = mb({"submit", "--file", file, "--json"});
  EXPECT_EQ(json::parse(r.out)["existing"], 3) << r.err;

  r = mb({"batch", "status", "remote", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["counts"]["queued"], 3);
  {
    JobStore store(test::store_options(db));
    EXPECT_EQ(store.get_by_key("remote/b")->spec.user, "u");
    auto jobs = store.claim("w", 1, std::chrono::milliseconds(60000));
    ASSERT_EQ(jobs.size(), 1u);
    ASSERT_EQ(store.fail("w", jobs[0].id, "boom", false), FailOutcome::Failed);
  }
  r = mb({"batch", "wait", "remote", "--timeout", "1", "--interval-ms", "50"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;
  EXPECT_EQ(mb({"batch", "purge", "remote"}).exit_code, 1) << "jobs are still queued";
  r = mb({"batch", "cancel", "remote", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["cancelled"], 2);
  r = mb({"batch", "retry", "remote", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["requeued"], 1);
  EXPECT_EQ(json::parse(r.out)["counts"]["queued"], 1);
  EXPECT_EQ(mb({"batch", "cancel", "remote"}).exit_code, 0);
  r = mb({"batch", "wait", "remote"});
  EXPECT_EQ(r.exit_code, 1) << "all final, none done";
  r = mb({"batch", "purge", "remote", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["deleted"], 3);
  r = mb({"batch", "status", "remote"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no jobs in batch 'remote'"), std::string::npos) << r.err;

  // export through the endpoint writes the files an export on the database host writes: one
  // done job in the output, a failed and a cancelled one in the error file, one still queued.
  test::write_file(file, line("a", "") + line("b", "") + line("c", "") + line("d", ""));
  ASSERT_EQ(mb({"submit", "--file", file}).exit_code, 0);
  {
    JobStore store(test::store_options(db));
    auto jobs = store.claim("w", 2, std::chrono::milliseconds(60000));
    ASSERT_EQ(jobs.size(), 2u);
    ASSERT_TRUE(store.complete("w", jobs[0].id, JobResult{"out \"a\"\n", 3, 2, "stop", {}}, {}));
    ASSERT_EQ(store.fail("w", jobs[1].id, "boom", false), FailOutcome::Failed);
    ASSERT_TRUE(store.cancel(store.get_by_key("remote/c")->id));
  }
  r = mb({"export", "--batch", "remote", "-o", dir.file("remote.out"), "--error-file",
          dir.file("remote.err")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 done, 2 failed or cancelled; 1 not finished yet"), std::string::npos)
      << r.err;
  r = test::run_cli({"export", "--db", db.string(), "--batch", "remote", "-o",
                     dir.file("local.out"), "--error-file", dir.file("local.err")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(dir.file("remote.out")), test::read_file(dir.file("local.out")));
  EXPECT_EQ(test::read_file(dir.file("remote.err")), test::read_file(dir.file("local.err")));
  const json done = json::parse(test::read_file(dir.file("remote.out")));
  EXPECT_EQ(done["custom_id"], "a");
  EXPECT_EQ(done["response"]["body"]["choices"][0]["text"], "out \"a\"\n");
  EXPECT_EQ(mb({"export", "--batch", "nothing-here"}).exit_code, 2);

  // The client splits a large import into messages under the request limit.
  zi::ClientOptions o;
  o.endpoint = endpoint;
  o.max_request_bytes = 4096;
  zi::LazyPirateClient client(o);
  std::vector<JobSpec> specs;
  for (int i = 0; i < 10; ++i) specs.push_back(test::text_job(std::string(1000, 'x')));
  auto ids = client.submit_jobs(specs);
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_GE(client.sends(), 3);
  serve->signal(SIGTERM);
  EXPECT_EQ(serve->wait(), 0);
}

}  // namespace
}  // namespace moebatch
