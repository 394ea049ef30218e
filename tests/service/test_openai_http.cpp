// The OpenAI-compatible API of an in-process service on the demo model, at the HTTP level:
// requests become high-priority jobs with latency rows; streamed text equals the stored text and
// stops before a stop string; a client that leaves cancels its job and frees its slot; errors
// (400/401/404/405/413/429/503) have OpenAI's shape; keys and the loopback rule. Files and
// batches run on a SQLite file and on PostgreSQL (Stores/OpenAiHttpStore.*/sqlite|postgres).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "service/config.h"
#include "service/service.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/wait.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using nlohmann::json;

ServiceConfig api_config(const std::filesystem::path& dir) {
  ServiceConfig c = test::demo_service_config(dir);
  c.tokenizer = test::test_data_dir() + "/qwen3-tokenizer";
  c.served_model_name = "demo";
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 256;
  c.warmup_seqs = 1;
  return c;
}

using Running = test::RunningService;

test::HttpResult post(int port, const std::string& path, const json& body,
                      std::vector<std::pair<std::string, std::string>> headers = {}) {
  headers.emplace_back("Content-Type", "application/json");
  return test::http_request(port, "POST", path, body.dump(), headers);
}

json chat_body(json extra = json::object()) {
  json j = {{"model", "demo"},
            {"messages", {{{"role", "user"}, {"content", "Tell me about experts."}}}},
            {"temperature", 0},
            {"max_tokens", 6}};
  j.update(extra);
  return j;
}

/// A streamed response taken apart.
struct Sse {
  std::string text;                   ///< the deltas joined
  std::optional<std::string> finish;  ///< the last chunk's finish_reason
  std::optional<json> usage;          ///< the usage chunk
  bool done = false;                  ///< [DONE] seen
  int chunks = 0;                     ///< data events other than [DONE]
};

Sse parse_sse(const std::string& body) {
  Sse s;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    const size_t e = body.find("\n\n", p);
    const std::string data = body.substr(p + 6, e - p - 6);
    p = e;
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    ++s.chunks;
    const json j = json::parse(data);
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c.contains("delta")) s.text += c["delta"].value("content", "");
    if (c.contains("text")) s.text += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"].get<std::string>();
  }
  return s;
}

int64_t job_of(const std::string& response_id) {
  return std::stoll(response_id.substr(response_id.rfind('-') + 1));
}

/// A streaming request on a raw connection, left open until the object goes.
struct OpenStream {
  net::io_context io;
  net::ip::tcp::socket s{io};
  std::string got;
  OpenStream(int port, const json& body) {
    s.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
    const std::string b = body.dump();
    const std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: "
        "close\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(b.size()) + "\r\n\r\n" + b;
    net::write(s, net::buffer(req));
  }
  /// Reads until `n` data events arrived (true) or the server closed (false).
  bool read_events(int n) {
    char buf[4096];
    while (true) {
      size_t count = 0;
      for (size_t p = 0; (p = got.find("data: ", p)) != std::string::npos; ++p) ++count;
      if (static_cast<int>(count) >= n) return true;
      boost::system::error_code ec;
      const size_t k = s.read_some(net::buffer(buf), ec);
      if (ec) return false;
      got.append(buf, k);
    }
  }
};

TEST(OpenAiHttp, RequestsBecomeHighPriorityJobsWithResultAndLatencyRows) {
  test::TempDir dir;
  Running r(api_config(dir.path()));
  auto models = test::http_request(r.port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const json m = json::parse(models.body);
  EXPECT_EQ(m["data"][0]["id"], "demo");
  EXPECT_GT(m["data"][0]["max_model_len"].get<int64_t>(), 100);
  EXPECT_EQ(json::parse(test::http_request(r.port(), "GET", "/v1/models/demo").body)["id"], "demo");
  EXPECT_EQ(test::http_request(r.port(), "GET", "/v1/models/other").status, 404);

  auto c = post(r.port(), "/v1/chat/completions", chat_body());
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = json::parse(c.body);
  EXPECT_EQ(cj["object"], "chat.completion");
  const int64_t id = job_of(cj["id"]);
  const auto db = dir.path() / "jobs.db";
  const std::string row = "FROM jobs WHERE id = " + std::to_string(id);
  EXPECT_EQ(test::query_text(db, "SELECT state " + row), "done");
  EXPECT_EQ(test::query_i64(db, "SELECT priority " + row), 1000);
  EXPECT_EQ(test::query_text(db, "SELECT batch_id " + row), "openai-api");
  EXPECT_EQ(test::query_text(db, "SELECT result_text " + row),
            cj["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(test::query_i64(db, "SELECT completion_tokens " + row),
            cj["usage"]["completion_tokens"].get<int64_t>());
  EXPECT_EQ(test::query_i64(db, "SELECT prompt_tokens " + row),
            cj["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(
      test::query_i64(db, "SELECT count(*) FROM job_latency WHERE job_id = " + std::to_string(id)),
      1);

  auto t = post(r.port(), "/v1/completions",
                {{"model", "demo"}, {"prompt", "Once upon"}, {"max_tokens", 4}, {"seed", 3}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json tj = json::parse(t.body);
  EXPECT_EQ(tj["object"], "text_completion");
  EXPECT_EQ(tj["usage"]["completion_tokens"], 4);
  EXPECT_EQ(tj["choices"][0]["finish_reason"], "length");

  // Template variables reach the template and are stored with the job.
  auto think = post(r.port(), "/v1/chat/completions",
                    chat_body({{"chat_template_kwargs", {{"enable_thinking", false}}}}));
  ASSERT_EQ(think.status, 200) << think.body;
  const json thj = json::parse(think.body);
  EXPECT_EQ(test::query_text(db, "SELECT chat_template_kwargs FROM jobs WHERE id = " +
                                     std::to_string(job_of(thj["id"]))),
            R"({"enable_thinking":false})");
  // The empty think block the template adds makes the prompt longer.
  EXPECT_GT(thj["usage"]["prompt_tokens"].get<int64_t>(),
            cj["usage"]["prompt_tokens"].get<int64_t>());
}

TEST(OpenAiHttp, StreamedTextEqualsTheStoredTextAndEndsBeforeAStopString) {
  test::TempDir dir;
  Running r(api_config(dir.path()));
  const json sampled = {{"temperature", 1.0}, {"top_k", 50}, {"seed", 11}, {"max_tokens", 40}};
  auto full = post(r.port(), "/v1/chat/completions", chat_body(sampled));
  ASSERT_EQ(full.status, 200) << full.body;
  const std::string text = json::parse(full.body)["choices"][0]["message"]["content"];
  ASSERT_GT(text.size(), 8u) << text;

  json streamed = chat_body(sampled);
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto s = post(r.port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.headers["content-type"], "text/event-stream");
  const Sse sse = parse_sse(s.body);
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(sse.text, text);
  EXPECT_GT(sse.chunks, 3);
  EXPECT_EQ(sse.finish, std::optional<std::string>("length"));
  ASSERT_TRUE(sse.usage);
  EXPECT_EQ((*sse.usage)["completion_tokens"], 40);

  // A stop string from the middle of that text: the same draws, cut before its first match.
  size_t k = text.size() / 2;
  while (k < text.size() && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) ++k;
  size_t e = k + 1;
  while (e < text.size() && (static_cast<unsigned char>(text[e]) & 0xC0) == 0x80) ++e;
  const std::string stop = text.substr(k, e - k);
  const std::string expected = text.substr(0, text.find(stop));
  streamed["stop"] = {stop};
  auto cut = post(r.port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(cut.status, 200);
  const Sse cs = parse_sse(cut.body);
  EXPECT_EQ(cs.text, expected) << "stop " << json(stop).dump();
  EXPECT_EQ(cs.finish, std::optional<std::string>("stop"));
  EXPECT_TRUE(cs.done);
  const auto db = dir.path() / "jobs.db";
  EXPECT_EQ(test::query_text(db, "SELECT result_text FROM jobs ORDER BY id DESC LIMIT 1"),
            expected);

  json text_stream = {{"model", "demo"}, {"prompt", "abc"}, {"max_tokens", 5}, {"stream", true}};
  const Sse ts = parse_sse(post(r.port(), "/v1/completions", text_stream).body);
  EXPECT_TRUE(ts.done);
  EXPECT_EQ(ts.text, test::query_text(db, "SELECT result_text FROM jobs ORDER BY id DESC LIMIT 1"));
}

TEST(OpenAiHttp, ErrorsHaveOpenAisShapeAndStatus) {
  test::TempDir dir;
  Running r(api_config(dir.path()));
  auto expect_error = [&](const test::HttpResult& res, int status, const std::string& param) {
    EXPECT_EQ(res.status, status) << res.body;
    const json j = json::parse(res.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << res.body;
    for (const char* k : {"message", "type", "param", "code"})
      EXPECT_TRUE(j["error"].contains(k)) << k << " in " << res.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << res.body;
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << res.body;
    }
  };
  const int p = r.port();
  expect_error(test::http_request(p, "POST", "/v1/chat/completions", "{oops"), 400, "");
  expect_error(post(p, "/v1/chat/completions", chat_body({{"n", 2}})), 400, "n");
  expect_error(post(p, "/v1/chat/completions", chat_body({{"temperature", "warm"}})), 400,
               "temperature");
  expect_error(post(p, "/v1/chat/completions", chat_body({{"model", "gpt-4"}})), 404, "model");
  expect_error(post(p, "/v1/chat/completions",
                    chat_body({{"chat_template_kwargs", {{"reasoning_effort", "high"}}}})),
               400, "chat_template_kwargs");
  expect_error(post(p, "/v1/chat/completions", chat_body({{"max_tokens", 30000}})), 400,
               "messages");
  expect_error(test::http_request(p, "GET", "/v1/chat/completions"), 405, "");
  expect_error(test::http_request(p, "GET", "/v1/nothing"), 404, "");
  expect_error(test::http_request(p, "POST", "/v1/completions", std::string(2 << 20, ' ')), 413,
               "");
  // Nothing above reached the queue, and the daemon still serves.
  EXPECT_EQ(test::query_i64(dir.path() / "jobs.db", "SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(post(p, "/v1/chat/completions", chat_body()).status, 200);
  EXPECT_EQ(test::http_request(p, "GET", "/health").status, 200);
}

TEST(OpenAiHttp, QueueFullIs429AndAClientThatLeavesCancelsItsJob) {
  test::TempDir dir;
  ServiceConfig cfg = api_config(dir.path());
  cfg.api_max_pending = 1;
  Running r(cfg);
  const auto db = dir.path() / "jobs.db";
  {
    OpenStream open(
        r.port(),
        chat_body({{"stream", true}, {"max_tokens", 3000}, {"temperature", 1}, {"top_k", 20}}));
    ASSERT_TRUE(open.read_events(3)) << open.got;
    auto busy = post(r.port(), "/v1/chat/completions", chat_body());
    EXPECT_EQ(busy.status, 429) << busy.body;
    EXPECT_EQ(busy.headers["retry-after"], "1");
    EXPECT_EQ(json::parse(busy.body)["error"]["code"], "queue_full");
    EXPECT_EQ(test::query_text(db, "SELECT state FROM jobs WHERE id = 1"), "running");
  }  // the client goes away mid-stream
  EXPECT_TRUE(test::wait_until(
      [&] { return test::query_text(db, "SELECT state FROM jobs WHERE id = 1") == "cancelled"; },
      10s));
  EXPECT_TRUE(test::wait_until(
      [&] {
        const std::string m = test::http_request(r.port(), "GET", "/metrics").body;
        return test::metric_value(m, "moebatch_engine_active_sequences") == 0 &&
               test::metric_value(m, "moebatch_api_open_requests") == 0;
      },
      10s));
  EXPECT_EQ(post(r.port(), "/v1/chat/completions", chat_body()).status, 200);
}

// A call whose job waits in the queue and is ended by another connection (a CLI cancel, another
// daemon) is answered from the final-event log at the next poll, well inside the 5 s of the
// look-up that backs it up.
TEST(OpenAiHttp, ACallWhoseQueuedJobIsCancelledElsewhereIsAnsweredAtOnce) {
  test::TempDir dir;
  ServiceConfig cfg = api_config(dir.path());
  cfg.max_num_seqs = 1;  // one slot and one hand-off place: two streams take both
  Running r(cfg);
  const auto db = dir.path() / "jobs.db";
  const json long_stream =
      chat_body({{"stream", true}, {"max_tokens", 3000}, {"temperature", 1}, {"top_k", 20}});
  OpenStream first(r.port(), long_stream);
  ASSERT_TRUE(first.read_events(2)) << first.got;
  OpenStream second(r.port(), long_stream);
  ASSERT_TRUE(test::wait_until(
      [&] { return test::query_i64(db, "SELECT count(*) FROM jobs WHERE state = 'running'") == 2; },
      10s));
  std::optional<test::HttpResult> answer;
  std::thread call([&] { answer = post(r.port(), "/v1/chat/completions", chat_body()); });
  // No ASSERT until the call thread is joined: the cancel below ends the call either way.
  EXPECT_TRUE(test::wait_until(
      [&] { return test::query_text(db, "SELECT state FROM jobs WHERE id = 3") == "queued"; },
      10s));
  JobStore other(test::store_options(db));
  EXPECT_TRUE(other.cancel(3));
  const auto cancelled_at = std::chrono::steady_clock::now();
  call.join();
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled_at, 2s);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 500) << answer->body;
  EXPECT_EQ(json::parse(answer->body)["error"]["code"], "job_cancelled") << answer->body;
}

TEST(OpenAiHttp, MaintenanceAnswers503WhileTheStreamInFlightFinishes) {
  MB_SKIP_UNDER_TSAN("the 1,500-token stream must finish within the 60 s drain");
  test::TempDir dir;
  Running r(api_config(dir.path()));
  OpenStream open(r.port(), chat_body({{"stream", true}, {"max_tokens", 1500}}));
  ASSERT_TRUE(open.read_events(2)) << open.got;
  r.svc.request_maintenance();
  test::HttpResult during;
  ASSERT_TRUE(test::wait_until(
      [&] {
        during = post(r.port(), "/v1/chat/completions", json::object());
        return during.status == 503;
      },
      10s))
      << during.status << " " << during.body;
  EXPECT_EQ(json::parse(during.body)["error"]["code"], "engine_restarting");
  EXPECT_FALSE(during.headers["retry-after"].empty());
  // The drain lets the stream finish; then the API admits again.
  EXPECT_FALSE(open.read_events(1 << 20));
  const Sse sse = parse_sse(open.got.substr(open.got.find("\r\n\r\n")));
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(sse.finish, std::optional<std::string>("length"));
  EXPECT_TRUE(test::wait_until(
      [&] { return post(r.port(), "/v1/chat/completions", chat_body()).status == 200; }, 20s));
}

using OpenAiHttpStore = test::StoreKindTest;
MB_INSTANTIATE_STORE_TESTS(OpenAiHttpStore);

// POST /v1/files: `content` as the file part, `purpose` as its field.
test::HttpResult upload_file(int port, const std::string& purpose, const std::string& content,
                             const std::string& filename = "f.jsonl") {
  const std::string body = "--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n" +
                           purpose +
                           "\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; "
                           "filename=\"" +
                           filename + "\"\r\n\r\n" + content + "\r\n--b--\r\n";
  return test::http_request(port, "POST", "/v1/files", body,
                            {{"Content-Type", "multipart/form-data; boundary=b"}});
}

TEST_P(OpenAiHttpStore, FilesAndBatchesRefuseBadInputNamingTheField) {
  ServiceConfig cfg = api_config(scratch());
  cfg.db = location();
  Running r(cfg);
  test::SideConnection side(location());
  const int p = r.port();
  auto upload = [&](const std::string& purpose, const std::string& content) {
    return upload_file(p, purpose, content);
  };
  auto param_of = [](const test::HttpResult& res) {
    return json::parse(res.body)["error"]["param"];
  };
  EXPECT_EQ(param_of(upload("fine-tune", "{}")), "purpose");
  EXPECT_EQ(param_of(upload("batch", "")), "file");
  EXPECT_EQ(param_of(upload("batch", "\xff\xfe")), "file");
  EXPECT_EQ(test::http_request(p, "POST", "/v1/files", "purpose=batch").status, 400);
  EXPECT_EQ(upload("batch", std::string(17 << 20, 'x')).status, 413);
  const auto ok = upload("batch", R"({"custom_id":"a","method":"POST","url":"/v1/completions",)"
                                  R"("body":{"model":"demo","prompt":"hi","max_tokens":2}})");
  ASSERT_EQ(ok.status, 200) << ok.body;
  const std::string file = json::parse(ok.body)["id"];

  auto create = [&](json body) {
    return test::http_request(p, "POST", "/v1/batches", body.dump());
  };
  const json good = {
      {"input_file_id", file}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}};
  json b = good;
  b["endpoint"] = "/v1/embeddings";
  EXPECT_EQ(param_of(create(b)), "endpoint");
  b = good;
  b["completion_window"] = "1h";
  EXPECT_EQ(param_of(create(b)), "completion_window");
  b = good;
  b["metadata"] = {{"k", 1}};
  EXPECT_EQ(param_of(create(b)), "metadata");
  b = good;
  b["priority"] = 5;
  EXPECT_EQ(param_of(create(b)), "priority");
  b = good;
  b["input_file_id"] = "file-nope";
  EXPECT_EQ(create(b).status, 404);
  // A batch whose lines go to another endpoint fails, naming the line; nothing is queued.
  b = good;
  b["endpoint"] = "/v1/chat/completions";
  const json failed = json::parse(create(b).body);
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_EQ(failed["errors"]["data"][0]["line"], 1);
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM jobs"), 0);

  const json done = json::parse(create(good).body);
  EXPECT_EQ(done["status"], "in_progress");
  EXPECT_TRUE(test::wait_until(
      [&] {
        return json::parse(
                   test::http_request(p, "GET", "/v1/batches/" + done["id"].get<std::string>())
                       .body)["status"] == "completed";
      },
      20s));
  EXPECT_EQ(
      test::http_request(p, "POST", "/v1/batches/" + done["id"].get<std::string>() + "/cancel")
          .status,
      400);
  EXPECT_EQ(test::http_request(p, "GET", "/v1/batches/batch_nope").status, 404);
  EXPECT_EQ(test::http_request(p, "GET", "/v1/batches?limit=0").status, 400);
  // Strict, as every door of the queue: a duplicate key is refused, not last-one-wins.
  const auto dup = test::http_request(
      p, "POST", "/v1/batches",
      R"({"input_file_id":"x","input_file_id":"y","endpoint":"/v1/chat/completions",)"
      R"("completion_window":"24h"})",
      {{"Content-Type", "application/json"}});
  EXPECT_EQ(dup.status, 400) << dup.body;
  EXPECT_NE(dup.body.find("duplicate"), std::string::npos) << dup.body;
  EXPECT_EQ(test::http_request(p, "GET", "/v1/files/file-nope/content").status, 404);
  EXPECT_EQ(test::http_request(p, "GET", "/v1/files?limit=x").status, 400);
  const json files = json::parse(test::http_request(p, "GET", "/v1/files?purpose=batch").body);
  ASSERT_EQ(files["data"].size(), 1u);
  EXPECT_EQ(files["data"][0]["id"], file);
  const json list = json::parse(test::http_request(p, "GET", "/v1/batches?limit=1").body);
  EXPECT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["has_more"], true);
  // The output file holds the request's result.
  const json finished = json::parse(
      test::http_request(p, "GET", "/v1/batches/" + done["id"].get<std::string>()).body);
  const auto output = test::http_request(
      p, "GET", "/v1/files/" + finished["output_file_id"].get<std::string>() + "/content");
  EXPECT_EQ(output.status, 200);
  EXPECT_EQ(json::parse(output.body)["custom_id"], "a") << output.body;
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM jobs WHERE state = 'done'"), 1);
  EXPECT_EQ(test::http_request(p, "GET", "/health").status, 200);
}

// A batch whose errors quote a UTF-8 character cut in two, or whose requests the store refuses,
// fails with a readable error and holds up no other batch, also when the periodic check
// validates it (a batch left validating by a crash). A cancel takes every unfinished request at
// once. Client mistakes are 400s, not 500s (which the SDKs retry).
// A file of many stored pieces downloads whole, byte for byte, under one Content-Length (the
// daemon sends it a piece at a time); HEAD gives the length alone; the connection serves the
// next request after it.
TEST_P(OpenAiHttpStore, AFileOfManyPiecesDownloadsWhole) {
  ServiceConfig cfg = api_config(scratch());
  cfg.db = location();
  Running r(cfg);
  std::string content;
  for (int line = 0; content.size() < 5 * kFileChunkBytes + 777; ++line)
    content += "{\"custom_id\":\"r" + std::to_string(line) +
               "\",\"note\":\"\xE2\x82\xAC\xF0\x9F\x98\x80\"}\n";
  const auto up = upload_file(r.port(), "batch", content);
  ASSERT_EQ(up.status, 200) << up.body;
  const std::string id = json::parse(up.body)["id"];
  test::HttpClient c(r.port());
  const auto head = c.request("HEAD", "/v1/files/" + id + "/content");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.headers.at("content-length"), std::to_string(content.size()));
  EXPECT_TRUE(head.body.empty());
  const auto got = c.request("GET", "/v1/files/" + id + "/content");
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.headers.at("content-length"), std::to_string(content.size()));
  EXPECT_EQ(got.headers.count("transfer-encoding"), 0u);
  EXPECT_TRUE(got.body == content) << got.body.size() << " of " << content.size() << " bytes";
  EXPECT_EQ(json::parse(c.request("GET", "/v1/files/" + id).body)["bytes"], content.size());
  EXPECT_EQ(c.request("DELETE", "/v1/files/" + id).status, 200);
  EXPECT_EQ(c.request("GET", "/v1/files/" + id + "/content").status, 404);
}

TEST_P(OpenAiHttpStore, ABadBatchFailsAloneAndClientErrorsAre400) {
  ServiceConfig cfg = api_config(scratch());
  cfg.db = location();
  Running r(cfg);
  test::SideConnection side(location());
  const int p = r.port();
  const bool pg = GetParam() == StoreKind::Postgres;
  auto file_id = [&](const test::HttpResult& res) -> std::string {
    EXPECT_EQ(res.status, 200) << res.body;
    return res.status == 200 ? json::parse(res.body)["id"].get<std::string>() : "";
  };
  auto line = [](const std::string& id, const json& body) {
    return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}
        .dump();
  };
  auto create = [&](const std::string& file) {
    return test::http_request(
        p, "POST", "/v1/batches",
        json{{"input_file_id", file}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}}
            .dump());
  };
  auto get = [&](const std::string& id) {
    return json::parse(test::http_request(p, "GET", "/v1/batches/" + id).body);
  };
  std::string e40;
  for (int i = 0; i < 40; ++i) e40 += "\xc3\xa9";  // é
  const json prompt = {{"model", "demo"}, {"prompt", "hi"}, {"max_tokens", 2}};

  // Line 1 repeats an 81-byte key, line 2 has a metadata key over 64 bytes: messages quote the
  // first 64 bytes of a key, which end inside an é.
  json meta = prompt;
  meta["metadata"] = {{"k: " + e40, "v"}};
  const std::string dup_key = "\"a" + e40 + "\":1";
  const std::string bad = file_id(upload_file(
      p, "batch",
      "{" + dup_key + "," + dup_key + "," + line("d", prompt).substr(1) + "\n" + line("m", meta)));
  const std::string good = file_id(upload_file(p, "batch", line("a", prompt)));

  const auto bad_reply = create(bad);
  ASSERT_EQ(bad_reply.status, 200) << bad_reply.body;
  auto expect_readable_failure = [&](const json& b) {
    EXPECT_EQ(b["status"], "failed");
    ASSERT_EQ(b["errors"]["data"].size(), 2u) << b.dump();
    EXPECT_EQ(b["errors"]["data"][0]["line"], 1);
    EXPECT_NE(b["errors"]["data"][0]["message"].get<std::string>().find("duplicate key 'a"),
              std::string::npos);
    EXPECT_EQ(b["errors"]["data"][1]["line"], 2);
    EXPECT_NE(b["errors"]["data"][1]["message"].get<std::string>().find("longer than 64 bytes"),
              std::string::npos);
  };
  const json failed = json::parse(bad_reply.body);  // throws on invalid UTF-8
  expect_readable_failure(failed);
  const std::string failed_id = failed["id"];
  // As a crash before validation leaves it: the periodic check validates it again.
  EXPECT_EQ(side.exec("UPDATE batches SET status = 'validating', errors = NULL, failed_at = NULL "
                      "WHERE id = '" +
                      failed_id + "'"),
            "");
  const json started = json::parse(create(good).body);
  EXPECT_EQ(started["status"], "in_progress");
  EXPECT_TRUE(test::wait_until(
      [&] {
        return get(started["id"].get<std::string>())["status"] == "completed" &&
               get(failed_id)["status"] != "validating";
      },
      20s));
  expect_readable_failure(get(failed_id));
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM jobs WHERE batch_id = '" + failed_id + "'"), 0);

  // PostgreSQL text holds no NUL byte: a prompt with one fails its batch, naming it; a file with
  // one is refused at upload. SQLite takes both.
  json nul = prompt;
  nul["prompt"] = std::string("h\0i", 3);
  const json nul_batch = json::parse(create(file_id(upload_file(p, "batch", line("n", nul)))).body);
  if (pg) {
    EXPECT_EQ(nul_batch["status"], "failed");
    EXPECT_NE(nul_batch["errors"]["data"][0]["message"].get<std::string>().find("NUL byte"),
              std::string::npos)
        << nul_batch.dump();
  } else {
    EXPECT_EQ(nul_batch["status"], "in_progress");
  }
  const auto nul_file = upload_file(p, "batch", std::string("{}\0", 3));
  EXPECT_EQ(nul_file.status, pg ? 400 : 200) << nul_file.body;
  if (pg) {
    EXPECT_EQ(json::parse(nul_file.body)["error"]["type"], "invalid_request_error");
  }

  // A long filename is cut to 256 bytes at a character boundary.
  const auto named = upload_file(p, "batch", line("a", prompt), "a" + e40 + e40 + e40 + e40);
  ASSERT_EQ(named.status, 200) << named.body;
  std::string cut = "a";
  for (int i = 0; i < 127; ++i) cut += "\xc3\xa9";
  EXPECT_EQ(json::parse(named.body)["filename"], cut);

  const auto no_file = test::http_request(
      p, "POST", "/v1/batches",
      json{{"endpoint", "/v1/completions"}, {"completion_window", "24h"}}.dump());
  EXPECT_EQ(no_file.status, 400);
  EXPECT_EQ(json::parse(no_file.body)["error"]["param"], "input_file_id");
  EXPECT_EQ(json::parse(no_file.body)["error"]["code"], "missing_required_parameter");

  // Cancel: every unfinished request goes at once; the batch ends cancelled.
  json slow = prompt;
  slow["max_tokens"] = 200;
  std::string lines;
  for (int i = 0; i < 6; ++i) lines += line("s" + std::to_string(i), slow) + "\n";
  const json to_cancel = json::parse(create(file_id(upload_file(p, "batch", lines))).body);
  const std::string cancel_id = to_cancel["id"];
  const auto cancelled = test::http_request(p, "POST", "/v1/batches/" + cancel_id + "/cancel");
  EXPECT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_TRUE(test::wait_until([&] { return get(cancel_id)["status"] == "cancelled"; }, 20s));
  const json counts = get(cancel_id)["request_counts"];
  EXPECT_EQ(counts["completed"].get<int>() + counts["failed"].get<int>(), 6) << counts.dump();
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM jobs WHERE batch_id = '" + cancel_id +
                           "' AND state IN ('queued', 'running')"),
            0);
  EXPECT_EQ(test::http_request(p, "GET", "/health").status, 200);
}

TEST(OpenAiHttp, KeysGuardTheApiAndNonLoopbackNeedsThem) {
  test::TempDir dir;
  test::write_file(dir.path() / "keys", "# team keys\n\n  key-one  \nkey-two\n");
  ServiceConfig cfg = api_config(dir.path());
  cfg.api_key_file = dir.file("keys");
  Running r(cfg);
  const int p = r.port();
  auto none = test::http_request(p, "GET", "/v1/models");
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(json::parse(none.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(
      test::http_request(p, "GET", "/v1/models", "", {{"Authorization", "Bearer key-on"}}).status,
      401);
  EXPECT_EQ(
      test::http_request(p, "GET", "/v1/models", "", {{"Authorization", "Bearer key-two"}}).status,
      200);
  EXPECT_EQ(
      post(p, "/v1/chat/completions", chat_body(), {{"Authorization", "Bearer key-one"}}).status,
      200);
  EXPECT_EQ(test::http_request(p, "GET", "/health").status, 200);  // probes stay open

  ServiceConfig open = api_config(dir.path());
  open.http_host = "0.0.0.0";
  EXPECT_THROW(validate_config(open), InputError);
  open.api_key_file = dir.file("keys");
  EXPECT_NO_THROW(validate_config(open));
  EXPECT_EQ(load_api_keys(dir.path() / "keys"), (std::vector<std::string>{"key-one", "key-two"}));
  test::write_file(dir.path() / "empty", "# nothing\n\n");
  EXPECT_THROW(load_api_keys(dir.path() / "empty"), InputError);
  test::write_file(dir.path() / "spaced", "two words\n");
  EXPECT_THROW(load_api_keys(dir.path() / "spaced"), InputError);
  EXPECT_THROW(load_api_keys(dir.path() / "missing"), InputError);
}

}  // namespace
}  // namespace moebatch
