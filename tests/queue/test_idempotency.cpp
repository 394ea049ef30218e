// Idempotency keys name one request: the same key with the same payload returns the job, with
// another payload it is a KeyConflictError and nothing is written; batch keys cannot collide
// across the batch id / custom_id boundary; the payload hash is plain SHA-256.
#include <gtest/gtest.h>

#include "queue/job_store.h"
#include "queue/openai_batch.h"
#include "queue/payload_hash.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using test::store_options;
using test::text_job;

class QueueIdempotency : public test::StoreKindTest {
 protected:
  JobStore store{store_options(location())};
};

MB_INSTANTIATE_STORE_TESTS(QueueIdempotency);

TEST(QueuePayloadHash, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first block's padding.
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Every field counts; the key does not.
  JobSpec a = text_job("p", "k1");
  JobSpec b = text_job("p", "k2");
  EXPECT_EQ(job_payload_hash(a), job_payload_hash(b));
  b.sampling.seed = 0;
  EXPECT_NE(job_payload_hash(a), job_payload_hash(b));
  b = a;
  b.sampling.stop = {"x", "y"};
  JobSpec c = a;
  c.sampling.stop = {"xy"};
  EXPECT_NE(job_payload_hash(b), job_payload_hash(c));
}

TEST_P(QueueIdempotency, SameKeyWithAnotherPayloadIsAConflict) {
  const SubmitResult first = store.submit(text_job("write a poem", "k"));
  ASSERT_TRUE(first.created);
  const SubmitResult again = store.submit(text_job("write a poem", "k"));
  EXPECT_EQ(again.id, first.id);
  EXPECT_FALSE(again.created);
  try {
    store.submit(text_job("delete the poem", "k"));
    FAIL() << "a different payload under a used key was accepted";
  } catch (const KeyConflictError& e) {
    EXPECT_EQ(e.key(), "k");
    EXPECT_EQ(e.existing_id(), first.id);
    EXPECT_NE(std::string(e.what()).find("different payload"), std::string::npos) << e.what();
  }
  JobSpec more_tokens = text_job("write a poem", "k");
  more_tokens.sampling.max_tokens = 999;
  EXPECT_THROW(store.submit(more_tokens), KeyConflictError);
  // One conflicting spec in a list rolls back the whole list; its index is named.
  try {
    store.submit_many({text_job("fresh", "k-new"), text_job("other", "k")});
    FAIL() << "conflict not detected inside submit_many";
  } catch (const KeyConflictError& e) {
    EXPECT_EQ(e.index(), 1u);
  }
  EXPECT_FALSE(store.get_by_key("k-new"));
  EXPECT_EQ(store.list({}).size(), 1u);
  EXPECT_EQ(store.get(first.id)->spec.prompt, "write a poem");
}

TEST_P(QueueIdempotency, RepeatsInsideOneListFollowTheSameRule) {
  auto r = store.submit_many({text_job("a", "dup"), text_job("a", "dup")});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(r[0].created);
  EXPECT_EQ(r[1].id, r[0].id);
  EXPECT_FALSE(r[1].created);
  EXPECT_THROW(store.submit_many({text_job("b", "dup2"), text_job("c", "dup2")}), KeyConflictError);
  EXPECT_FALSE(store.get_by_key("dup2"));
}

TEST_P(QueueIdempotency, RowsWithoutAStoredHashAreComparedByTheirContent) {
  // A plain-SQL producer (or a release before payload hashes) leaves payload_hash NULL.
  test::SideConnection producer(location());
  ASSERT_EQ(
      producer.exec("INSERT INTO jobs (client_key, prompt, max_tokens) VALUES ('ext', 'p', 7)"),
      "");
  JobSpec same = text_job("p", "ext");
  same.sampling.max_tokens = 7;
  const SubmitResult r = store.submit(same);
  EXPECT_FALSE(r.created);
  EXPECT_EQ(r.id, store.get_by_key("ext")->id);
  EXPECT_THROW(store.submit(text_job("p", "ext")), KeyConflictError);  // max_tokens 256
}

TEST_P(QueueIdempotency, BatchKeysDoNotCollideAcrossTheSlash) {
  EXPECT_NE(batch_client_key("x/y", "z"), batch_client_key("x", "y/z"));
  EXPECT_NE(batch_client_key("a\\", "b"), batch_client_key("a", "\\b"));
  EXPECT_NE(batch_client_key("a\\/b", "c"), batch_client_key("a\\", "b/c"));
  EXPECT_EQ(batch_client_key("plain", "c/d"), "plain/c/d");  // as earlier releases wrote it
  const std::string line_z =
      R"({"custom_id":"z","method":"POST","url":"/v1/completions","body":{"prompt":"one"}})";
  const std::string line_yz =
      R"({"custom_id":"y/z","method":"POST","url":"/v1/completions","body":{"prompt":"two"}})";
  const JobLimits limits;
  auto r = store.submit_many(
      {parse_batch_line(line_z, 1, "x/y", limits), parse_batch_line(line_yz, 1, "x", limits)});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(r[0].created);
  EXPECT_TRUE(r[1].created) << "the second batch's job was taken for the first one";
  EXPECT_EQ(store.get(r[1].id)->spec.prompt, "two");
  // Re-importing either line is still idempotent.
  EXPECT_FALSE(store.submit(parse_batch_line(line_yz, 1, "x", limits)).created);
}

}  // namespace
}  // namespace moebatch
