// The Files and Batch API records: files round-trip, batches move forward only (each transition
// conditional on the current status), finish writes both files and the status at once, and
// listing pages newest first; on SQLite and on PostgreSQL
// (Stores/BatchStoreTest.*/sqlite|postgres).
#include <gtest/gtest.h>

#include "common/error.h"
#include "queue/batch_store_backend.h"
#include "queue/job_validate.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "tests/common/files.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using BatchStoreTest = test::StoreKindTest;
MB_INSTANTIATE_STORE_TESTS(BatchStoreTest);

TEST_P(BatchStoreTest, FilesRoundTripAndDelete) {
  JobStore jobs(test::store_options(location()));  // migrates the database
  BatchStore store(location());
  const StoredFile f = store.add_file("batch", "in.jsonl", "{\"a\":1}\n", 100);
  EXPECT_EQ(f.id.rfind("file-", 0), 0u);
  EXPECT_EQ(f.bytes, 8);
  EXPECT_EQ(store.file(f.id)->filename, "in.jsonl");
  EXPECT_EQ(store.file_content(f.id), std::optional<std::string>("{\"a\":1}\n"));
  EXPECT_NE(store.add_file("batch", "in.jsonl", "x", 100).id, f.id);
  bool more = true;
  const auto listed = store.list_files(std::nullopt, 10, std::string("batch"), more);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_FALSE(more);
  EXPECT_EQ(listed[1].id, f.id);  // newest first
  EXPECT_TRUE(store.list_files(std::nullopt, 10, std::string("batch_output"), more).empty());
  EXPECT_EQ(store.list_files(listed[0].id, 10, std::nullopt, more).size(), 1u);
  EXPECT_TRUE(store.delete_file(f.id));
  EXPECT_FALSE(store.delete_file(f.id));
  EXPECT_FALSE(store.file(f.id));
  EXPECT_FALSE(store.file_content("file-nope"));
}

// Pieces end on character boundaries (PostgreSQL text holds each alone) and join back whole.
TEST(FileContent, PiecesEndOnCharacterBoundaries) {
  const std::string euro = "\xE2\x82\xAC", emoji = "\xF0\x9F\x98\x80";
  for (size_t max : {4u, 5u, 6u, 7u, 9u}) {
    const std::string text = "a" + euro + "bc" + emoji + emoji + "d" + euro + euro;
    std::string joined;
    for (std::string_view piece : split_file_content(text, max)) {
      EXPECT_LE(piece.size(), max);
      EXPECT_FALSE(piece.empty());
      EXPECT_TRUE(is_valid_utf8(piece)) << "max " << max;
      joined += piece;
    }
    EXPECT_EQ(joined, text);
  }
  // Not UTF-8 (a run of continuation bytes): cut where it falls, nothing lost.
  const std::string bad(10, '\x80');
  const auto pieces = split_file_content(bad, 4);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].size(), 4u);
  EXPECT_TRUE(split_file_content("", 4).empty());
  EXPECT_THROW(split_file_content("abc", 3), Error);
}

// A file over one piece: stored in pieces of kFileChunkBytes at most, each readable alone, the
// whole content back in order; deleting the file removes its pieces.
TEST_P(BatchStoreTest, AFileOverOnePieceIsStoredAndReadInPieces) {
  JobStore jobs(test::store_options(location()));
  BatchStore store(location());
  std::string content;
  for (int line = 0; content.size() < 2 * kFileChunkBytes + 1000; ++line)
    content += "{\"custom_id\":\"r" + std::to_string(line) +
               "\",\"text\":\"\xE2\x82\xAC\xF0\x9F\x98\x80\"}\n";
  const StoredFile f = store.add_file("batch", "big.jsonl", content, 100);
  EXPECT_EQ(f.bytes, static_cast<int64_t>(content.size()));
  EXPECT_TRUE(store.file_content(f.id) == content);
  std::string joined;
  int64_t seq = 0;
  while (auto piece = store.file_chunk(f.id, seq)) {
    EXPECT_LE(piece->size(), kFileChunkBytes);
    EXPECT_TRUE(is_valid_utf8(*piece)) << "piece " << seq;
    joined += *piece;
    ++seq;
  }
  EXPECT_EQ(seq, 3);
  EXPECT_TRUE(joined == content);
  EXPECT_FALSE(store.file_chunk("file-nope", 0));
  EXPECT_TRUE(store.delete_file(f.id));
  EXPECT_FALSE(store.file_chunk(f.id, 0));
  EXPECT_FALSE(store.file_content(f.id));
  // A batch's output files are stored the same way.
  BatchRecord in;
  in.input_file_id = "file-x";
  in.endpoint = "/v1/completions";
  in.completion_window = "24h";
  const BatchRecord b = store.add_batch(in);
  ASSERT_TRUE(store.transition(b.id, "validating", "in_progress", 12, 1));
  ASSERT_TRUE(store.finish(b.id, "in_progress", "completed", content, "", 20));
  const auto out_id = store.batch(b.id)->output_file_id;
  ASSERT_TRUE(out_id);
  EXPECT_TRUE(store.file_chunk(*out_id, 2));
  EXPECT_TRUE(store.file_content(*out_id) == content);
}

TEST_P(BatchStoreTest, BatchesMoveForwardOnlyAndFinishAtomically) {
  JobStore jobs(test::store_options(location()));
  BatchStore store(location());
  BatchRecord in;
  in.input_file_id = "file-x";
  in.endpoint = "/v1/completions";
  in.completion_window = "24h";
  in.metadata = R"({"k":"v"})";
  in.created_at = 10;
  in.expires_at = 10 + 86400;
  const BatchRecord b = store.add_batch(in);
  EXPECT_EQ(b.id.rfind("batch_", 0), 0u);
  EXPECT_EQ(store.batch(b.id)->status, "validating");
  EXPECT_FALSE(store.transition(b.id, "in_progress", "completed", 11));  // not there
  EXPECT_TRUE(store.transition(b.id, "validating", "in_progress", 12, 3));
  EXPECT_FALSE(store.transition(b.id, "validating", "in_progress", 13, 5));  // done once
  BatchRecord now = *store.batch(b.id);
  EXPECT_EQ(now.total, 3);
  EXPECT_EQ(now.in_progress_at, std::optional<int64_t>(12));
  EXPECT_EQ(now.metadata, in.metadata);
  EXPECT_EQ(store.batches_with_status({"in_progress"}).size(), 1u);

  // Jobs of the batch are counted by state (what the batch object's request_counts show).
  JobSpec s = test::text_job("p");
  s.batch_id = b.id;
  jobs.submit(s);
  jobs.submit(s);
  const BatchCounts counts = jobs.batch_counts(b.id);
  EXPECT_EQ(counts.total, 2);
  EXPECT_EQ(counts.counts.at(JobState::Queued), 2);
  EXPECT_EQ(counts.counts.at(JobState::Done), 0);

  EXPECT_TRUE(store.finish(b.id, "in_progress", "completed", "out\n", "", 20));
  EXPECT_FALSE(store.finish(b.id, "in_progress", "completed", "again\n", "", 21));
  now = *store.batch(b.id);
  EXPECT_EQ(now.status, "completed");
  EXPECT_EQ(now.completed_at, std::optional<int64_t>(20));
  EXPECT_EQ(now.finalizing_at, std::optional<int64_t>(20));
  ASSERT_TRUE(now.output_file_id);
  EXPECT_FALSE(now.error_file_id);  // no errors, no error file
  EXPECT_EQ(store.file_content(*now.output_file_id), std::optional<std::string>("out\n"));
  EXPECT_EQ(store.file(*now.output_file_id)->purpose, "batch_output");

  const BatchRecord bad = store.add_batch(in);
  EXPECT_TRUE(
      store.transition(bad.id, "validating", "failed", 30, std::nullopt, R"([{"line":1}])"));
  EXPECT_EQ(store.batch(bad.id)->errors, std::optional<std::string>(R"([{"line":1}])"));
}

TEST_P(BatchStoreTest, ListPagesNewestFirst) {
  JobStore jobs(test::store_options(location()));
  BatchStore store(location());
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    BatchRecord b;
    b.input_file_id = "f";
    b.endpoint = "/v1/completions";
    b.completion_window = "24h";
    ids.push_back(store.add_batch(b).id);
  }
  bool more = false;
  auto page = store.list_batches(std::nullopt, 2, more);
  ASSERT_EQ(page.size(), 2u);
  EXPECT_TRUE(more);
  EXPECT_EQ(page[0].id, ids[4]);
  EXPECT_EQ(page[1].id, ids[3]);
  page = store.list_batches(page.back().id, 10, more);
  ASSERT_EQ(page.size(), 3u);
  EXPECT_FALSE(more);
  EXPECT_EQ(page.back().id, ids[0]);
}

TEST_P(BatchStoreTest, TwoStoresFinishOneBatchOnceAndUnstorableUploadsAreRefused) {
  JobStore jobs(test::store_options(location()));
  BatchStore a(location()), b(location());
  BatchRecord in;
  in.input_file_id = "f";
  in.endpoint = "/v1/completions";
  in.completion_window = "24h";
  const BatchRecord batch = a.add_batch(in);
  ASSERT_TRUE(a.transition(batch.id, "validating", "in_progress", 1, 1));
  // Two hosts finishing one batch: the second finds it moved on and writes no second file.
  EXPECT_TRUE(a.finish(batch.id, "in_progress", "completed", "out\n", "err\n", 2));
  EXPECT_FALSE(b.finish(batch.id, "in_progress", "completed", "out\n", "err\n", 3));
  bool more = true;
  EXPECT_EQ(b.list_files(std::nullopt, 10, std::string("batch_output"), more).size(), 2u);
  EXPECT_EQ(b.batch(batch.id)->error_file_id, a.batch(batch.id)->error_file_id);
  const std::string bad("a\0b\xff", 4);
  if (postgres()) {
    // PostgreSQL text holds neither: refused with the reason, nothing stored.
    EXPECT_THROW(a.add_file("batch", "in.jsonl", bad, 4), InputError);
    EXPECT_EQ(b.list_files(std::nullopt, 10, std::string("batch"), more).size(), 0u);
  } else {
    EXPECT_EQ(a.file_content(a.add_file("batch", "in.jsonl", bad, 4).id), bad);
  }
}

}  // namespace
}  // namespace moebatch
