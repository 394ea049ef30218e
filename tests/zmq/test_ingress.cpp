// The ingress end to end on real sockets and a real SQLite file: acked submits are rows,
// duplicate keys return the existing id, the query commands answer from the store, completion
// notices reach the subscriber of their batch only, and stop() answers what it accepted.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "queue/zmq/client.h"
#include "tests/zmq/zmq_test_util.h"

namespace moebatch::test {
namespace {

using nlohmann::json;
namespace zi = moebatch::zmq_ingress;

TEST(Ingress, AckedSubmitIsACommittedRow) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  json reply = peer.call(submit_request(
      "r1", json::array({{{"prompt", "one"}, {"key", "k1"}, {"batch_id", "b"}},
                         {{"prompt", "two"}, {"max_tokens", 5}}})));
  ASSERT_EQ(reply["ok"], true) << reply.dump();
  EXPECT_EQ(reply["id"], "r1");
  ASSERT_EQ(reply["jobs"].size(), 2u);
  // A separate connection sees the rows as soon as the ack arrived: the commit came first.
  JobStore store(store_options(dir.path() / "jobs.db"));
  auto j1 = store.get(reply["jobs"][0]["id"].get<int64_t>());
  auto j2 = store.get(reply["jobs"][1]["id"].get<int64_t>());
  ASSERT_TRUE(j1 && j2);
  EXPECT_EQ(j1->spec.prompt, "one");
  EXPECT_EQ(j1->spec.client_key, "k1");
  EXPECT_EQ(j1->spec.batch_id, "b");
  EXPECT_EQ(j2->spec.sampling.max_tokens, 5);
  EXPECT_EQ(reply["jobs"][0]["created"], true);
}

TEST(Ingress, DuplicateKeyReturnsTheExistingJob) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  json a = peer.call(submit_request(1, json::array({{{"prompt", "p"}, {"key", "dup"}}})));
  // The same key with the same payload, twice in one request (a different payload is a
  // key_conflict: tests/queue/test_queue_zmq.cpp).
  json b = peer.call(submit_request(2, json::array({{{"prompt", "p"}, {"key", "dup"}},
                                                    {{"prompt", "p"}, {"key", "dup"}}})));
  ASSERT_EQ(a["ok"], true);
  ASSERT_EQ(b["ok"], true);
  EXPECT_EQ(b["jobs"][0]["id"], a["jobs"][0]["id"]);
  EXPECT_EQ(b["jobs"][1]["id"], a["jobs"][0]["id"]);
  EXPECT_EQ(b["jobs"][0]["created"], false);
  JobStore store(store_options(dir.path() / "jobs.db"));
  EXPECT_EQ(store.stats().counts[JobState::Queued], 1);
}

TEST(Ingress, StatusResultCancelAndStats) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint(), zmq::socket_type::req);
  json s = peer.call(submit_request("s", json::array({{{"prompt", "a"}, {"key", "ka"}},
                                                      {{"prompt", "b"}, {"key", "kb"}}})));
  const int64_t a = s["jobs"][0]["id"], b = s["jobs"][1]["id"];
  // Finish job a through the store, as the dispatcher would.
  JobStore store(store_options(dir.path() / "jobs.db"));
  auto claimed = store.claim("w", 1, std::chrono::milliseconds(60000));
  ASSERT_EQ(claimed.size(), 1u);
  ASSERT_EQ(claimed[0].id, a);
  ASSERT_TRUE(store.complete("w", a, JobResult{"the answer", 3, 2, "stop", {}}, {}));

  json st = peer.call({{"v", 1}, {"cmd", "status"}, {"id", 1}, {"key", "ka"}});
  ASSERT_EQ(st["ok"], true) << st.dump();
  EXPECT_EQ(st["job"]["id"], a);
  EXPECT_EQ(st["job"]["state"], "done");
  json res = peer.call({{"v", 1}, {"cmd", "result"}, {"id", 2}, {"job_id", a}});
  EXPECT_EQ(res["result"]["text"], "the answer");
  EXPECT_EQ(res["result"]["completion_tokens"], 2);
  json pending = peer.call({{"v", 1}, {"cmd", "result"}, {"id", 3}, {"job_id", b}});
  EXPECT_EQ(pending["job"]["state"], "queued");
  EXPECT_TRUE(pending["result"].is_null());
  json c = peer.call({{"v", 1}, {"cmd", "cancel"}, {"id", 4}, {"job_id", b}});
  EXPECT_EQ(c["cancelled"], true);
  EXPECT_EQ(c["job"]["state"], "cancelled");
  json c2 = peer.call({{"v", 1}, {"cmd", "cancel"}, {"id", 5}, {"job_id", a}});
  EXPECT_EQ(c2["cancelled"], false);
  json nf = peer.call({{"v", 1}, {"cmd", "status"}, {"id", 6}, {"job_id", 999}});
  EXPECT_EQ(nf["ok"], false);
  EXPECT_EQ(nf["error"]["code"], "not_found");
  EXPECT_EQ(nf["error"]["field"], "job_id");
  json stats = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", 7}});
  EXPECT_EQ(stats["queue"]["counts"]["done"], 1);
  EXPECT_EQ(stats["queue"]["counts"]["cancelled"], 1);
  EXPECT_EQ(stats["ingress"]["jobs_created"], 2);
  EXPECT_EQ(stats["ingress"]["errors"], 1);
}

TEST(Ingress, StatsReusesTheQueueSnapshotWhileTheIngressCountersStayLive) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.worker.stats_max_age = std::chrono::hours(1);
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  ASSERT_EQ(peer.call(submit_request(1, json::array({{{"prompt", "a"}}})))["ok"], true);
  json first = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", 2}});
  ASSERT_EQ(first["ok"], true) << first.dump();
  EXPECT_EQ(first["queue"]["counts"]["queued"], 1);
  EXPECT_EQ(first["queue"]["latency_window"], 10000);
  // A job from another connection and one through the ingress: within the hour the queue part
  // is the snapshot read for the first request (no second store query), the counters are not.
  JobStore store(store_options(dir.path() / "jobs.db"));
  store.submit(text_job("b"));
  ASSERT_EQ(peer.call(submit_request(3, json::array({{{"prompt", "c"}}})))["ok"], true);
  json second = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", 4}});
  ASSERT_EQ(second["ok"], true) << second.dump();
  EXPECT_EQ(second["queue"]["counts"], first["queue"]["counts"]);
  EXPECT_GE(second["queue"]["age_ms"].get<int64_t>(), first["queue"]["age_ms"].get<int64_t>());
  EXPECT_EQ(second["ingress"]["jobs_created"], 2);
  EXPECT_EQ(store.stats().counts.at(JobState::Queued), 3);
}

TEST(Ingress, StatsWithoutMaxAgeReadsTheStoreEachTime) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.worker.stats_max_age = std::chrono::milliseconds(0);
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  JobStore store(store_options(dir.path() / "jobs.db"));
  for (int i = 1; i <= 3; ++i) {
    store.submit(text_job("p" + std::to_string(i)));
    json st = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", i}});
    ASSERT_EQ(st["ok"], true) << st.dump();
    EXPECT_EQ(st["queue"]["counts"]["queued"], i);
  }
}

TEST(Ingress, ConcurrentProducersAreAllAckedExactlyOnce) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  constexpr int kProducers = 6, kMessages = 20, kPerMessage = 10;
  std::vector<std::thread> threads;
  std::atomic<int> acked{0};
  std::mutex mu;
  std::set<int64_t> ids;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      zi::ClientOptions o;
      o.endpoint = ingress.router_endpoint();
      zi::LazyPirateClient client(o);
      for (int m = 0; m < kMessages; ++m) {
        std::vector<JobSpec> specs;
        for (int i = 0; i < kPerMessage; ++i) {
          specs.push_back(
              text_job("p", "p" + std::to_string(p) + "-" + std::to_string(m * kPerMessage + i)));
        }
        auto r = client.submit_jobs(specs);
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& s : r) ids.insert(s.id);
        acked += static_cast<int>(r.size());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(acked.load(), kProducers * kMessages * kPerMessage);
  EXPECT_EQ(ids.size(), static_cast<size_t>(kProducers * kMessages * kPerMessage));
  JobStore store(store_options(dir.path() / "jobs.db"));
  EXPECT_EQ(store.stats().counts[JobState::Queued], kProducers * kMessages * kPerMessage);
  // Group commit: fewer transactions than messages is likely but not guaranteed; at most one
  // per message is.
  EXPECT_LE(ingress.counters().commits.load(), static_cast<uint64_t>(kProducers * kMessages));
}

TEST(Ingress, CompletionNoticeReachesTheBatchSubscriberOnly) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, zi::notice_topic(std::string("mine")));
  sub.connect(ingress.pub_endpoint());
  // PUB/SUB subscriptions propagate asynchronously: publish until the first notice arrives.
  zi::CompletionNotice other{1, "k-other", std::string("mine-too"), JobState::Done, {}};
  zi::CompletionNotice mine{2, "k-mine", std::string("mine"), JobState::Failed, "boom"};
  std::optional<json> got;
  for (int i = 0; i < 100 && !got; ++i) {
    // Published from another thread, as the result writer would.
    std::thread([&] {
      EXPECT_TRUE(ingress.publish_completion(other));
      EXPECT_TRUE(ingress.publish_completion(mine));
    }).join();
    zmq::pollitem_t item{static_cast<void*>(sub), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    while (item.revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(sub, std::back_inserter(frames), zmq::recv_flags::dontwait);
      if (frames.empty()) break;
      ASSERT_EQ(frames.size(), 2u);
      EXPECT_EQ(frames[0].to_string(), zi::notice_topic(std::string("mine")));
      json body = json::parse(frames[1].to_string());
      EXPECT_EQ(body["batch_id"], "mine");  // never "mine-too"
      got = body;
    }
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)["job_id"], 2);
  EXPECT_EQ((*got)["key"], "k-mine");
  EXPECT_EQ((*got)["state"], "failed");
  EXPECT_EQ((*got)["error"], "boom");
  // The counter is bumped by the socket thread right after the send; give it a moment.
  for (int i = 0; i < 100 && ingress.counters().notices.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(ingress.counters().notices.load(), 2u);
}

TEST(Ingress, StopAnswersAcceptedRequestsThenRefusesNewOnes) {
  TempDir dir;
  auto opts = loopback_options(dir);
  std::atomic<size_t> committed{0};
  opts.worker.on_committed = [&](size_t n) { committed += n; };
  auto ingress = std::make_unique<zi::Ingress>(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress->router_endpoint());
  for (int i = 0; i < 20; ++i) {
    peer.send(submit_request(i, json::array({{{"prompt", "x"}, {"key", std::to_string(i)}}})));
  }
  std::set<int> answered;
  while (answered.size() < 20) {
    json r = peer.recv();
    if (r.is_null()) break;
    EXPECT_EQ(r["ok"], true);
    answered.insert(r["id"].get<int>());
  }
  EXPECT_EQ(answered.size(), 20u);
  EXPECT_EQ(committed.load(), 20u);
  const std::string endpoint = ingress->router_endpoint();
  ingress->stop();
  ingress->stop();  // idempotent
  EXPECT_FALSE(ingress->publish_completion({3, {}, {}, JobState::Done, {}}));
  Peer late(ctx, endpoint);
  late.send(submit_request("late", json::array({{{"prompt", "x"}}})));
  EXPECT_FALSE(late.recv_frames(300).has_value());
}

}  // namespace
}  // namespace moebatch::test
