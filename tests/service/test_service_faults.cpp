// `moebatch serve` as a real process under faults: a connection flood that exhausts the
// process's descriptors (the HTTP listener backs off instead of spinning and logging, and
// /health answers once descriptors are free), and the PUB socket announcing every final
// transition, not only the service's own results (a cancel, a row the store finds invalid, a
// dead worker's job whose attempts ran out), seen through a real ZeroMQ SUB socket, with the
// queue in a SQLite file and in PostgreSQL (Stores/ServiceFaultsStore.*/sqlite|postgres).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <map>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "queue/job_store.h"
#include "queue/zmq/client.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

/// `moebatch serve` on the demo model with the ingress on free ports; `pre` runs it through a
/// shell line first (e.g. a ulimit), `extra` are more serve flags, `db` the database (default
/// `dir`/jobs.db).
struct ServeWithPorts {
  test::Child child;
  nlohmann::json ports;  // {"router", "pub", "http_port"}

  ServeWithPorts(const std::filesystem::path& dir, const std::string& pre,
                 const std::vector<std::string>& extra, const std::string& db = "")
      : child(argv(db.empty() ? (dir / "jobs.db").string() : db, pre, extra), dir / "serve.log") {}

  static std::vector<std::string> argv(const std::string& db, const std::string& pre,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> a =
        test::join_args({{test::moebatch_bin(), "serve", "--db", db, "--bind", "tcp://127.0.0.1:*",
                          "--http-port", "0", "--poll-ms", "10"},
                         test::demo_model_flags(),
                         test::small_engine_flags(2),
                         extra});
    if (pre.empty()) return a;
    // sh runs `pre`, then execs serve with its arguments ("$0" "$@").
    std::vector<std::string> sh = {"/bin/sh", "-c", pre + " && exec \"$0\" \"$@\""};
    sh.insert(sh.end(), a.begin(), a.end());
    return sh;
  }

  /// Waits for the ready line on stdout (in the log); a daemon takes ~20 s to start under TSan.
  bool ready() {
    return test::wait_until(
        [&] {
          const auto line = test::ready_line(child.read_log());
          if (line) ports = *line;
          return line.has_value();
        },
        test::under_tsan(30s));
  }
  int http_port() const { return ports["http_port"].get<int>(); }
};

unsigned short port_of(const std::string& endpoint) {
  return static_cast<unsigned short>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// 200 raw TCP connections to the ZeroMQ port with 128 descriptors, as the hostile test did:
// libzmq accepts until the process has none left, and an HTTP connection then waits in the
// backlog. The listener must neither spin nor log every failed accept, and must serve the
// waiting /health once the flood is gone.
TEST(ServiceFaults, DescriptorExhaustionBacksOffAndHealthAnswersOnceFreed) {
  test::TempDir dir;
  ServeWithPorts s(dir.path(), "ulimit -n 128", {});
  ASSERT_TRUE(s.ready()) << s.child.read_log();
  const int http_port = s.http_port();
  ASSERT_EQ(test::http_get(http_port, "/health").first, 200);

  namespace net = boost::asio;
  net::io_context io;
  const net::ip::address lo = net::ip::make_address("127.0.0.1");
  // Connected all at once: once libzmq has no descriptor left, its listen backlog fills and
  // the remaining connects wait on SYN retransmits, which need not finish.
  const net::ip::tcp::endpoint router(lo, port_of(s.ports["router"].get<std::string>()));
  std::vector<net::ip::tcp::socket> flood;
  flood.reserve(200);
  for (int i = 0; i < 200; ++i) {
    flood.emplace_back(io);
    flood.back().async_connect(router, [](const boost::system::error_code&) {});
  }
  io.run_for(1500ms);
  // A /health request that cannot be accepted while the flood holds every descriptor.
  net::ip::tcp::socket waiting(io);
  waiting.connect({lo, static_cast<unsigned short>(http_port)});
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  net::write(waiting, net::buffer(req));
  ASSERT_TRUE(test::wait_until(
      [&] {
        return s.child.read_log().find("accept failed: Too many open files") != std::string::npos;
      },
      5s))
      << "the flood did not exhaust the descriptors\n"
      << s.child.read_log();
  std::this_thread::sleep_for(1500ms);  // exhausted for a while: a spinning loop logs millions
  const std::string during = s.child.read_log();
  EXPECT_LE(occurrences(during, "accept failed"), 3u) << during.substr(0, 4000);

  for (auto& sock : flood) sock.close();
  // The waiting request is accepted and answered once descriptors are free again.
  std::string resp;
  boost::system::error_code ec;
  char buf[4096];
  const timeval limit{10, 0};  // a listener that never recovers fails the test, not hangs it
  setsockopt(waiting.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  while (!ec) {
    const size_t n = waiting.read_some(net::buffer(buf), ec);
    resp.append(buf, n);
  }
  EXPECT_EQ(resp.substr(0, 12), "HTTP/1.1 200") << resp << s.child.read_log().substr(0, 4000);
  EXPECT_EQ(test::http_get(http_port, "/health").first, 200);
  const std::string m = test::http_get(http_port, "/metrics").second;
  EXPECT_GT(test::metric_value(m, "moebatch_http_accept_failures_total"), 0) << m;
  s.child.signal(SIGTERM);
  EXPECT_EQ(s.child.wait_for(30s), 0) << s.child.read_log().substr(0, 4000);
}

/// Notices received on a SUB socket, by job key.
struct Notices {
  zmq::context_t ctx;
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  std::map<std::string, nlohmann::json> by_key;

  explicit Notices(const std::string& endpoint) {
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(endpoint);
  }
  /// Receives for up to `wait`; true when anything arrived.
  bool receive(std::chrono::milliseconds wait) {
    bool got = false;
    zmq::pollitem_t item{static_cast<void*>(sub), 0, ZMQ_POLLIN, 0};
    const auto end = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < end) {
      zmq::poll(&item, 1, 50ms);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(sub, std::back_inserter(frames), zmq::recv_flags::dontwait);
      if (frames.size() != 2) continue;
      auto j = nlohmann::json::parse(frames[1].to_string(), nullptr, false);
      if (j.is_discarded() || !j["key"].is_string()) continue;
      by_key[j["key"].get<std::string>()] = j;
      got = true;
    }
    return got;
  }
};

using ServiceFaultsStore = test::StoreKindTest;
MB_INSTANTIATE_STORE_TESTS(ServiceFaultsStore);

TEST_P(ServiceFaultsStore, PubAnnouncesEveryFinalTransition) {
  const std::string db = location();
  { JobStore create(test::store_options(db)); }  // serve would too; the SQL below needs it now
  ServeWithPorts s(scratch(), "", {"--pub", "tcp://127.0.0.1:*"}, db);
  ASSERT_TRUE(s.ready()) << s.child.read_log();
  Notices notices(s.ports["pub"].get<std::string>());
  test::SideConnection sql(db);
  // A subscription reaches the publisher asynchronously: finish small jobs until one's notice
  // arrives, so the cases below cannot be lost to a late subscription.
  bool subscribed = false;
  for (int i = 0; i < 40 && !subscribed; ++i) {
    ASSERT_EQ(sql.exec("INSERT INTO jobs (prompt, max_tokens, temperature, client_key) VALUES "
                       "('warm', 1, 0, 'warm-" +
                       std::to_string(i) + "')"),
              "");
    subscribed = notices.receive(250ms);
  }
  ASSERT_TRUE(subscribed) << s.child.read_log();

  // A queued job cancelled from another connection (as `moebatch cancel` does): not due for
  // an hour, so the service cannot have claimed it.
  ASSERT_EQ(sql.exec("INSERT INTO jobs (prompt, client_key, not_before) VALUES ('later', "
                     "'n-cancel', " +
                     std::to_string(SystemClock().now_ms() + 3600000) + ")"),
            "");
  JobStore store(test::store_options(db));
  ASSERT_TRUE(store.cancel(store.get_by_key("n-cancel")->id));
  // A plain-SQL row the store fails inside claim.
  ASSERT_EQ(sql.exec("INSERT INTO jobs (prompt, max_tokens, client_key) VALUES ('bad', -5, "
                     "'n-invalid')"),
            "");
  // A job a dead worker held on its last attempt: the store fails it when the lease is found
  // expired.
  ASSERT_EQ(sql.exec("INSERT INTO jobs (prompt, client_key, state, attempts, max_attempts, "
                     "lease_owner, lease_expires_at, started_at) VALUES ('orphan', 'n-lease', "
                     "'running', 1, 1, 'ghost:1:1', 1, 1)"),
            "");
  // A job through the daemon's own ZeroMQ ingress, into the same database.
  zmq_ingress::ClientOptions co;
  co.endpoint = s.ports["router"].get<std::string>();
  zmq_ingress::LazyPirateClient client(co);
  JobSpec zspec = test::text_job("over zmq", "n-zmq");
  zspec.sampling.max_tokens = 2;
  zspec.sampling.temperature = 0;
  ASSERT_TRUE(client.submit_jobs({zspec}).at(0).created);
  test::wait_until(
      [&] {
        notices.receive(100ms);
        return notices.by_key.count("n-cancel") && notices.by_key.count("n-invalid") &&
               notices.by_key.count("n-lease") && notices.by_key.count("n-zmq");
      },
      test::under_tsan(8s));
  ASSERT_EQ(notices.by_key.count("n-zmq"), 1u) << "no notice for the ZeroMQ job";
  EXPECT_EQ(notices.by_key["n-zmq"]["state"], "done");
  ASSERT_EQ(notices.by_key.count("n-cancel"), 1u) << "no notice for the cancelled job";
  EXPECT_EQ(notices.by_key["n-cancel"]["state"], "cancelled");
  ASSERT_EQ(notices.by_key.count("n-invalid"), 1u) << "no notice for the invalid row";
  EXPECT_EQ(notices.by_key["n-invalid"]["state"], "failed");
  EXPECT_NE(notices.by_key["n-invalid"]["error"].get<std::string>().find("invalid job row"),
            std::string::npos)
      << notices.by_key["n-invalid"];
  ASSERT_EQ(notices.by_key.count("n-lease"), 1u) << "no notice for the lease-exhausted job";
  EXPECT_EQ(notices.by_key["n-lease"]["state"], "failed");
  EXPECT_NE(notices.by_key["n-lease"]["error"].get<std::string>().find("max_attempts"),
            std::string::npos)
      << notices.by_key["n-lease"];
  s.child.signal(SIGTERM);
  EXPECT_EQ(s.child.wait_for(30s), 0) << s.child.read_log().substr(0, 4000);
}

}  // namespace
}  // namespace moebatch
