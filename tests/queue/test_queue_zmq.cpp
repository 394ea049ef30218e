// The queue behind its ZeroMQ front, on real sockets: a key reused with another payload is a
// key_conflict reply (also when the request shared a group commit with others), request JSON
// with duplicate or NUL-holding keys is bad_json, an oversize multipart message is answered
// too_large without being kept and the ingress keeps serving, and CURVE key files are handled
// as secrets.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "tests/zmq/zmq_test_util.h"

namespace moebatch::test {
namespace {

using nlohmann::json;
namespace zi = moebatch::zmq_ingress;

json submit_one(const json& id, const std::string& key, const std::string& prompt) {
  return submit_request(id, json::array({{{"prompt", prompt}, {"key", key}}}));
}

TEST(QueueZmq, KeyReusedWithAnotherPayloadIsAConflict) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  json r = peer.call(submit_one(1, "k", "summarize this"));
  ASSERT_EQ(r["ok"], true) << r.dump();
  const int64_t id = r["jobs"][0]["id"];
  r = peer.call(submit_one(2, "k", "summarize this"));
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["jobs"][0]["id"], id);
  EXPECT_EQ(r["jobs"][0]["created"], false);
  r = peer.call(submit_one(3, "k", "something else"));
  ASSERT_EQ(r["ok"], false) << r.dump();
  EXPECT_EQ(r["id"], 3);
  EXPECT_EQ(r["error"]["code"], "key_conflict");
  EXPECT_EQ(r["error"]["field"], "jobs[0].key");
  EXPECT_EQ(r["error"]["retryable"], false);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("job " + std::to_string(id)),
            std::string::npos);
  r = peer.call({{"v", 1}, {"cmd", "submit"}, {"id", 4}, {"job", {{"prompt", "x"}, {"key", "k"}}}});
  EXPECT_EQ(r["error"]["field"], "job.key") << r.dump();
  r = peer.call({{"v", 1}, {"cmd", "status"}, {"id", 5}, {"key", "k"}});
  EXPECT_EQ(r["job"]["id"], id);
}

TEST(QueueZmq, KeyConflictIsADocumentedReplyCode) {
  const auto schema = json::parse(read_file(source_dir() + "/schemas/zmq-reply.json"));
  const auto& codes = schema["properties"]["error"]["properties"]["code"]["enum"];
  EXPECT_NE(std::find(codes.begin(), codes.end(), std::string(zi::error_code::kKeyConflict)),
            codes.end());
}

TEST(QueueZmq, AConflictFailsOnlyItsOwnRequestInAGroupCommit) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer seed(ctx, ingress.router_endpoint());
  ASSERT_EQ(seed.call(submit_one("seed", "taken", "original"))["ok"], true);
  // Pipelined without waiting, so the store thread finds several submits queued together and
  // commits them in one transaction; request 20 reuses a key with another payload.
  Peer peer(ctx, ingress.router_endpoint());
  constexpr int kRequests = 40;
  for (int i = 0; i < kRequests; ++i) {
    peer.send(i == 20 ? submit_one(i, "taken", "changed")
                      : submit_one(i, "key-" + std::to_string(i), "job " + std::to_string(i)));
  }
  int ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    json r = peer.recv();
    ASSERT_TRUE(r.is_object());
    if (r["id"] == 20) {
      EXPECT_EQ(r["error"]["code"], "key_conflict") << r.dump();
    } else {
      EXPECT_EQ(r["ok"], true) << r.dump();
      ok += r["ok"] == true ? 1 : 0;
    }
  }
  EXPECT_EQ(ok, kRequests - 1);
  json st = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", "s"}});
  EXPECT_EQ(st["queue"]["counts"]["queued"], kRequests);  // the 39 and the seed
}

TEST(QueueZmq, RequestsWithDuplicateOrNulKeysAreBadJson) {
  TempDir dir;
  zi::Ingress ingress(loopback_options(dir));
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  // Which max_tokens would apply depends on the parser; neither is guessed.
  peer.send_frames({R"({"v":1,"cmd":"submit","id":1,"job":{"prompt":"p","max_tokens":1,)"
                    R"("max_tokens":30000}})"});
  json r = peer.recv();
  EXPECT_EQ(r["error"]["code"], "bad_json") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("duplicate key 'max_tokens'"),
            std::string::npos);
  peer.send_frames({R"({"v":1,"cmd":"submit","id":2,"job":{"prompt":"p","top_p\u0000":1}})"});
  r = peer.recv();
  EXPECT_EQ(r["error"]["code"], "bad_json") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("NUL"), std::string::npos);
  r = peer.call(submit_one(3, "fine", "p"));
  EXPECT_EQ(r["ok"], true) << r.dump();
}

TEST(QueueZmq, OversizeMultipartMessageIsRefusedAndTheIngressKeepsServing) {
  TempDir dir;
  auto opts = loopback_options(dir);
  opts.limits.max_request_bytes = 64 << 10;
  opts.max_message_bytes = 256 << 10;
  zi::Ingress ingress(opts);
  zmq::context_t ctx;
  Peer peer(ctx, ingress.router_endpoint());
  // 64 frames, each under ZMQ_MAXMSGSIZE, 12.5 MiB together: counted, not kept, not parsed.
  peer.send_frames(std::vector<std::string>(64, std::string(200 << 10, 'f')));
  json r = peer.recv();
  EXPECT_EQ(r["error"]["code"], "too_large") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("64 frame(s)"), std::string::npos);
  // Frames past the body within the budget are still bad_frames; a REQ peer's oversize message
  // is answered on its own envelope.
  peer.send_frames({R"({"v":1)", R"("cmd":"stats"})"});
  EXPECT_EQ(peer.recv()["error"]["code"], "bad_frames");
  Peer req(ctx, ingress.router_endpoint(), zmq::socket_type::req);
  req.send_frames({std::string(100 << 10, ' ')});
  EXPECT_EQ(req.recv()["error"]["code"], "too_large");
  // The ingress still answers, and nothing was queued.
  r = peer.call(submit_one("after", "after", "a valid job"));
  ASSERT_EQ(r["ok"], true) << r.dump();
  r = peer.call({{"v", 1}, {"cmd", "stats"}, {"id", "s"}});
  EXPECT_EQ(r["queue"]["counts"]["queued"], 1);
  EXPECT_EQ(r["ingress"]["errors"], 3);
}

TEST(QueueZmqCurve, SecretKeyFilesMustBePrivateAndSecret) {
  if (!zi::curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  TempDir dir;
  const zi::CurveKeyPair kp = zi::write_key_pair_files((dir.path() / "k").string());
  const auto key = dir.path() / "k.key";
  EXPECT_EQ(zi::load_secret_key_file(key).public_z85, kp.public_z85);
  // Readable by the group or others: refused, not just warned about.
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  try {
    zi::load_secret_key_file(key);
    ADD_FAILURE() << "a world-readable secret was used";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mode 0644"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(key.c_str(), 0640), 0);
  EXPECT_THROW(zi::load_secret_key_file(key), InputError);
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  // The public half given as the secret (labelled by keygen, or named *.pub), and the other
  // way round.
  ASSERT_EQ(::chmod((dir.path() / "k.pub").c_str(), 0600), 0);
  EXPECT_THROW(zi::load_secret_key_file(dir.path() / "k.pub"), InputError);
  write_file(dir.path() / "bare.pub", kp.public_z85 + "\n");
  ASSERT_EQ(::chmod((dir.path() / "bare.pub").c_str(), 0600), 0);
  EXPECT_THROW(zi::load_secret_key_file(dir.path() / "bare.pub"), InputError);
  EXPECT_THROW(zi::load_public_key_file(key), InputError);
  EXPECT_THROW(zi::load_allowed_keys_file(key), InputError);
  EXPECT_EQ(zi::load_public_key_file(dir.path() / "k.pub"), kp.public_z85);
  EXPECT_THROW(zi::load_secret_key_file(dir.path()), InputError);  // not a regular file
}

TEST(QueueZmqCurve, KeygenCreatesNewFilesOnlyWithTheirFinalModes) {
  if (!zi::curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  TempDir dir;
  // A dangling symlink where the secret goes: followed, it would write the secret elsewhere.
  const auto target = dir.path() / "elsewhere";
  std::filesystem::create_symlink(target, dir.path() / "s.key");
  EXPECT_THROW(zi::write_key_pair_files((dir.path() / "s").string()), InputError);
  EXPECT_FALSE(std::filesystem::exists(target));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "s.pub"));
  // .pub taken: no half pair is left behind.
  write_file(dir.path() / "t.pub", "taken\n");
  EXPECT_THROW(zi::write_key_pair_files((dir.path() / "t").string()), InputError);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "t.key"));
  // Whatever the umask, the modes are exactly 0600 and 0644.
  const mode_t old_mask = ::umask(0);
  zi::write_key_pair_files((dir.path() / "u").string());
  ::umask(old_mask);
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() / "u.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat((dir.path() / "u.pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

}  // namespace
}  // namespace moebatch::test
