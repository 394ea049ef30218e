// CURVE: key files are validated, listed clients are served, unknown keys and a wrong server key
// are refused, and CURVE never runs without a ZAP handler (no fail-open).
#include <gtest/gtest.h>

#include "queue/zmq/client.h"
#include "tests/zmq/zmq_test_util.h"

namespace moebatch::test {
namespace {

using nlohmann::json;
namespace zi = moebatch::zmq_ingress;

/// A server with one allowed client, keys round-tripped through files as in production.
struct CurveFixture {
  TempDir dir;
  zi::CurveKeyPair server, client;
  std::unique_ptr<zi::Ingress> ingress;

  CurveFixture() {
    zi::write_key_pair_files((dir.path() / "server").string());
    zi::write_key_pair_files((dir.path() / "client").string());
    server = zi::load_secret_key_file(dir.path() / "server.key");
    client = zi::load_secret_key_file(dir.path() / "client.key");
    write_file(
        dir.path() / "clients.txt",
        "# allowed producers\n\n" + zi::load_public_key_file(dir.path() / "client.pub") + "\n");
    auto opts = loopback_options(dir);
    opts.curve = zi::CurveServerConfig{server, zi::load_allowed_keys_file(dir.path() / "clients.txt")};
    ingress = std::make_unique<zi::Ingress>(opts);
  }

  zi::ClientOptions client_options(const zi::CurveKeyPair& me, const std::string& server_pub) {
    zi::ClientOptions o;
    o.endpoint = ingress->router_endpoint();
    o.timeout = std::chrono::milliseconds(700);
    o.attempts = 1;
    o.curve = zi::ClientCurve{server_pub, me};
    return o;
  }
};

TEST(Curve, KeyFilesAreValidated) {
  if (!zi::curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  TempDir dir;
  zi::CurveKeyPair kp = zi::write_key_pair_files((dir.path() / "k").string());
  EXPECT_EQ(zi::load_secret_key_file(dir.path() / "k.key").public_z85, kp.public_z85);
  EXPECT_EQ(zi::load_public_key_file(dir.path() / "k.pub"), kp.public_z85);
  EXPECT_EQ(std::filesystem::status(dir.path() / "k.key").permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  EXPECT_THROW(zi::write_key_pair_files((dir.path() / "k").string()), InputError);  // no overwrite
  write_file(dir.path() / "short", "abc\n");
  EXPECT_THROW(zi::load_public_key_file(dir.path() / "short"), InputError);
  write_file(dir.path() / "badchars", std::string(40, '"') + "\n");
  EXPECT_THROW(zi::load_public_key_file(dir.path() / "badchars"), InputError);
  write_file(dir.path() / "two", kp.public_z85 + "\n" + kp.public_z85 + "\n");
  EXPECT_THROW(zi::load_public_key_file(dir.path() / "two"), InputError);
  write_file(dir.path() / "empty", "# nothing\n");
  EXPECT_THROW(zi::load_allowed_keys_file(dir.path() / "empty"), InputError);
  write_file(dir.path() / "list", kp.public_z85 + "\nnot-a-key\n");
  try {
    zi::load_allowed_keys_file(dir.path() / "list");
    ADD_FAILURE() << "bad line accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("list:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zi::load_secret_key_file(dir.path() / "missing"), InputError);
}

TEST(Curve, ListedClientIsServedOthersAreRefused) {
  if (!zi::curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  CurveFixture f;
  zi::LazyPirateClient good(f.client_options(f.client, f.server.public_z85));
  json r = good.call({{"v", 1}, {"cmd", "stats"}});
  EXPECT_EQ(r["ok"], true) << r.dump();

  // An unknown client key: the handshake is denied by ZAP, so the request never arrives.
  zi::LazyPirateClient stranger(f.client_options(zi::curve_generate_key_pair(),
                                                 f.server.public_z85));
  EXPECT_THROW(stranger.call({{"v", 1}, {"cmd", "stats"}}), Error);
  EXPECT_GE(f.ingress->zap_denied(), 1u);

  // The right client key but the wrong server key: the handshake cannot complete.
  zi::LazyPirateClient spoofed(f.client_options(f.client, zi::curve_generate_key_pair().public_z85));
  EXPECT_THROW(spoofed.call({{"v", 1}, {"cmd", "stats"}}), Error);

  // A plaintext client is not admitted either.
  zi::ClientOptions plain = f.client_options(f.client, f.server.public_z85);
  plain.curve.reset();
  zi::LazyPirateClient plaintext(plain);
  EXPECT_THROW(plaintext.call({{"v", 1}, {"cmd", "stats"}}), Error);

  // Nothing above disturbed the listed client.
  EXPECT_EQ(good.call({{"v", 1}, {"cmd", "stats"}})["ok"], true);
}

TEST(Curve, RefusesToStartWhenTheZapHandlerCannotBeInstalled) {
  if (!zi::curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  zmq::context_t ctx;
  // Someone else already holds the ZAP endpoint of this context: ours must not silently run.
  zmq::socket_t squatter(ctx, zmq::socket_type::rep);
  squatter.set(zmq::sockopt::linger, 0);
  squatter.bind("inproc://zeromq.zap.01");
  EXPECT_THROW(zi::ZapHandler(ctx, {std::string(32, 'x')}), Error);
}

}  // namespace
}  // namespace moebatch::test
