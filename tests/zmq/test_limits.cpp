// Hostile and overload input on real sockets: every bad request gets a structured error and the
// ingress keeps serving; saturation is answered "busy", never with silence.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <thread>

#include "tests/zmq/zmq_test_util.h"

namespace moebatch::test {
namespace {

using nlohmann::json;
namespace zi = moebatch::zmq_ingress;

json stats_request() { return {{"v", 1}, {"cmd", "stats"}, {"id", "still-alive"}}; }

void expect_error(const json& r, const std::string& code,
                  const std::optional<std::string>& field = std::nullopt) {
  ASSERT_TRUE(r.is_object()) << r.dump();
  EXPECT_EQ(r["ok"], false) << r.dump();
  EXPECT_EQ(r["error"]["code"], code) << r.dump();
  EXPECT_TRUE(r["error"]["message"].is_string());
  if (field) {
    EXPECT_EQ(r["error"]["field"], *field) << r.dump();
  }
}

TEST(IngressLimits, BadRequestsGetStructuredErrorsAndServiceContinues) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.limits.max_request_bytes = 64 << 10;
  opts.max_message_bytes = 256 << 10;
  opts.limits.max_jobs_per_message = 3;
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());

  peer.send_frames({"{\"v\":1", "\"cmd\":\"stats\"}"});  // two body frames
  expect_error(peer.recv(), "bad_frames");
  peer.send_frames({std::string("\xff\xfe garbage", 10)});
  expect_error(peer.recv(), "bad_json");
  peer.send_frames({std::string(1000, '{')});
  expect_error(peer.recv(), "bad_json");
  expect_error(peer.call({{"v", 9}, {"cmd", "stats"}, {"id", 1}}), "bad_version", "v");
  expect_error(peer.call({{"v", 1}, {"cmd", "launch"}, {"id", 1}}), "unknown_command", "cmd");
  expect_error(peer.call(submit_request(1, json::array({{{"prompt", "x"}, {"top_p", 5}}}))),
               "invalid", "jobs[0].top_p");
  json four = json::array();
  for (int i = 0; i < 4; ++i) four.push_back({{"prompt", "x"}});
  expect_error(peer.call(submit_request(1, four)), "too_many_jobs", "jobs");
  // Between the application limit and ZMQ_MAXMSGSIZE: answered with too_large.
  json big = submit_request("big", json::array({{{"prompt", std::string(100 << 10, 'a')}}}));
  json r = peer.call(big);
  expect_error(r, "too_large");
  EXPECT_TRUE(r["id"].is_null());  // not parsed, so nothing to echo
  // Above ZMQ_MAXMSGSIZE the transport drops the connection: no reply to this peer at all...
  Peer huge(ctx, ingress.router_endpoint());
  huge.send(submit_request("huge", json::array({{{"prompt", std::string(512 << 10, 'a')}}})));
  EXPECT_FALSE(huge.recv_frames(500).has_value());
  // ...but everybody else is still served, and nothing was queued by any of the above.
  json alive = peer.call(stats_request());
  ASSERT_EQ(alive["ok"], true) << alive.dump();
  EXPECT_EQ(alive["id"], "still-alive");
  EXPECT_EQ(alive["queue"]["counts"]["queued"], 0);
  EXPECT_EQ(alive["ingress"]["errors"], 8);
}

TEST(IngressLimits, ReqStyleEnvelopeIsAnsweredWithItsDelimiter) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  // A REQ socket only accepts replies carrying the empty delimiter; a reply at all proves it.
  Peer req(ctx, ingress.router_endpoint(), zmq::socket_type::req);
  req.send_frames({"{}"});
  expect_error(req.recv(), "invalid", "id");
  EXPECT_EQ(req.call(stats_request())["ok"], true);
  // A DEALER mimicking REQ gets the delimiter back too.
  Peer dealer(ctx, ingress.router_endpoint());
  dealer.send_frames({"", stats_request().dump()});
  auto frames = dealer.recv_frames();
  ASSERT_TRUE(frames);
  ASSERT_EQ(frames->size(), 2u);
  EXPECT_EQ((*frames)[0], "");
}

/// Holds the database's write lock from another connection until released.
class WriteLock {
 public:
  explicit WriteLock(const std::filesystem::path& db) {
    EXPECT_EQ(sqlite3_open(db.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  ~WriteLock() { release(); }
  void release() {
    if (!db_) return;
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
    db_ = nullptr;
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST(IngressLimits, FullHandOffRepliesBusyAndTheRestIsCommittedLater) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.worker.capacity = 1;
  opts.store.busy_timeout = std::chrono::milliseconds(10000);
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  ASSERT_EQ(peer.call(stats_request())["ok"], true);  // schema is in place
  WriteLock lock(opts.store.path);
  // The first submit occupies the store thread (waiting for the lock), the second fills the
  // one-slot queue, the rest must be refused at once.
  peer.send(submit_request("a", json::array({{{"prompt", "x"}, {"key", "a"}}})));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  peer.send(submit_request("b", json::array({{{"prompt", "x"}, {"key", "b"}}})));
  peer.send(submit_request("c", json::array({{{"prompt", "x"}, {"key", "c"}}})));
  json busy = peer.recv(2000);
  expect_error(busy, "busy");
  EXPECT_EQ(busy["id"], "c");
  EXPECT_EQ(busy["error"]["retryable"], true);
  lock.release();
  std::set<std::string> acked;
  for (int i = 0; i < 2; ++i) {
    json r = peer.recv();
    EXPECT_EQ(r["ok"], true) << r.dump();
    acked.insert(r["id"].get<std::string>());
  }
  EXPECT_EQ(acked, (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(ingress.counters().busy.load(), 1u);
}

TEST(IngressLimits, LockedStoreRepliesBusyWithNothingCommitted) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.store.busy_timeout = std::chrono::milliseconds(100);
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  ASSERT_EQ(peer.call(stats_request())["ok"], true);
  {
    WriteLock lock(opts.store.path);
    json r = peer.call(submit_request("x", json::array({{{"prompt", "x"}, {"key", "x"}}})));
    expect_error(r, "busy");
    EXPECT_EQ(r["error"]["retryable"], true);
  }
  // The retry with the same key succeeds once the lock is gone, and creates the job once.
  json r = peer.call(submit_request("x2", json::array({{{"prompt", "x"}, {"key", "x"}}})));
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["jobs"][0]["created"], true);
}

// Without max_message_bytes the ingress takes ZMQ_MAXMSGSIZE from its request limit
// (default_max_message_bytes, the one default serve and the demo use too): a body a little over
// the limit is answered too_large, a frame past the headroom drops only its connection.
TEST(IngressLimits, MessageLimitDefaultsJustAboveTheRequestLimit) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.limits.max_request_bytes = 64 << 10;
  ASSERT_FALSE(opts.max_message_bytes.has_value());
  EXPECT_EQ(zi::default_max_message_bytes(opts.limits), (64 << 10) + zi::kFrameHeadroom);
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  peer.send_frames({std::string((64 << 10) + zi::kFrameHeadroom - 1000, ' ')});
  expect_error(peer.recv(), "too_large");
  Peer huge(ctx, ingress.router_endpoint());
  huge.send_frames({std::string((64 << 10) + zi::kFrameHeadroom + 1000, ' ')});
  EXPECT_FALSE(huge.recv_frames(500).has_value()) << "a frame over the default limit was read";
  EXPECT_EQ(peer.call(stats_request())["ok"], true);
}

TEST(IngressLimits, OptionsThatCannotWorkAreRefused) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.max_message_bytes = static_cast<int64_t>(opts.limits.max_request_bytes);
  EXPECT_THROW(zi::Ingress{opts}, InputError);
  opts = loopback_options(dir);
  opts.bind = "tcp://256.0.0.1:1";
  EXPECT_THROW(zi::Ingress{opts}, Error);
  opts = loopback_options(dir);
  opts.store.path = dir.path() / "no-such-dir" / "jobs.db";
  EXPECT_THROW(zi::Ingress{opts}, Error);
}

}  // namespace
}  // namespace moebatch::test
