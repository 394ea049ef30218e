// JobStore on a real SQLite file and on a real PostgreSQL database (every test runs on both):
// submission, idempotency, validation, state machine, leases and their fencing tokens, retries,
// cancellation, stats and change detection. Time moves through a ManualClock.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "queue/batch_export.h"
#include "queue/job_store.h"
#include "queue/job_store_backend.h"
#include "queue/job_validate.h"
#include "queue/pg_conn.h"
#include "queue/sqlite_db.h"
#include "tests/common/files.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::store_options;
using test::text_job;

constexpr int64_t kT0 = 1'800'000'000'000;  // a fixed epoch-ms start for the manual clock

class JobStoreTest : public test::StoreKindTest {
 protected:
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>(kT0);
  JobStore store{store_options(location(), clock)};
};

MB_INSTANTIATE_STORE_TESTS(JobStoreTest);

TEST_P(JobStoreTest, StateNamesRoundTrip) {
  for (JobState s : {JobState::Queued, JobState::Running, JobState::Done, JobState::Failed,
                     JobState::Cancelled}) {
    EXPECT_EQ(job_state_from_string(job_state_to_string(s)), s);
  }
  EXPECT_FALSE(job_state_from_string("finished").has_value());
  EXPECT_TRUE(job_state_is_final(JobState::Cancelled));
  EXPECT_FALSE(job_state_is_final(JobState::Running));
}

TEST_P(JobStoreTest, FreshDatabaseIsAtLatestSchema) {
  EXPECT_EQ(store.kind(), GetParam());
  EXPECT_EQ(store.schema_version(), JobStore::schema_version_latest(GetParam()));
  EXPECT_GE(JobStore::schema_version_latest(), 2);
}

TEST_P(JobStoreTest, SubmitStoresEveryField) {
  JobSpec s = text_job("hello", "k1");
  s.batch_id = "b";
  s.custom_id = "c";
  s.model = "qwen3-moe";
  s.priority = 7;
  s.sampling = {12, 0.5, 0.9, 40, 1234, {"END", "\n\n"}};
  s.max_attempts = 4;
  SubmitResult r = store.submit(s);
  ASSERT_TRUE(r.created);
  auto j = store.get(r.id);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->spec.client_key, "k1");
  EXPECT_EQ(j->spec.batch_id, "b");
  EXPECT_EQ(j->spec.custom_id, "c");
  EXPECT_EQ(j->spec.model, "qwen3-moe");
  EXPECT_EQ(j->spec.priority, 7);
  EXPECT_EQ(j->spec.prompt, "hello");
  EXPECT_EQ(j->spec.sampling.max_tokens, 12);
  EXPECT_DOUBLE_EQ(j->spec.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(j->spec.sampling.top_p, 0.9);
  EXPECT_EQ(j->spec.sampling.top_k, 40);
  EXPECT_EQ(j->spec.sampling.seed, 1234);
  EXPECT_EQ(j->spec.sampling.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_EQ(j->spec.max_attempts, 4);
  EXPECT_EQ(j->state, JobState::Queued);
  EXPECT_EQ(j->enqueued_at, kT0);
  EXPECT_EQ(j->attempts, 0);
}

TEST_P(JobStoreTest, ResubmitWithSameKeyReturnsExistingJob) {
  SubmitResult a = store.submit(text_job("first", "same"));
  SubmitResult b = store.submit(text_job("first", "same"));
  EXPECT_TRUE(a.created);
  EXPECT_FALSE(b.created);
  EXPECT_EQ(a.id, b.id);
  // Another payload under the key is a conflict (test_idempotency.cpp), never the old job.
  EXPECT_THROW(store.submit(text_job("second", "same")), KeyConflictError);
  EXPECT_EQ(store.get_by_key("same")->spec.prompt, "first");
  // Jobs without a key are never merged.
  EXPECT_NE(store.submit(text_job("x")).id, store.submit(text_job("x")).id);
  auto many = store.submit_many({text_job("first", "same"), text_job("z", "new")});
  EXPECT_EQ(many[0].id, a.id);
  EXPECT_FALSE(many[0].created);
  EXPECT_TRUE(many[1].created);
}

TEST_P(JobStoreTest, SubmitRejectsBadSpecsNamingTheField) {
  auto expect_field = [&](JobSpec s, const std::string& field) {
    try {
      store.submit(s);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field + ":"), std::string::npos) << e.what();
    }
  };
  JobSpec s = text_job("p");
  s.sampling.max_tokens = -1;
  expect_field(s, "max_tokens");
  s = text_job(std::string(store.options().limits.max_prompt_bytes + 1, 'a'));
  expect_field(s, "prompt");
  s = text_job("p");
  s.sampling.temperature = std::nan("");
  expect_field(s, "temperature");
  s = text_job("[{\"role\":\"user\"}]");
  s.prompt_kind = PromptKind::Chat;
  expect_field(s, "messages[0].content");
  s = text_job("{not json");
  s.prompt_kind = PromptKind::Chat;
  expect_field(s, "prompt");
  s = text_job("p");
  s.sampling.stop = {""};
  expect_field(s, "stop[0]");
  s = text_job("\xff\xfe");
  expect_field(s, "prompt");
  EXPECT_TRUE(store.list({}).empty());
}

TEST(JobValidate, ChatTextIsQuotedInShort) {
  // A prompt may hold a megabyte-long role or key; the message (to the client, or into a failed
  // row's error) quotes 32 bytes of it.
  const std::string big(100000, 'r');
  auto e = find_chat_messages_error(R"([{"role":")" + big + R"(","content":"x"}])", JobLimits{});
  ASSERT_TRUE(e);
  EXPECT_LT(e->size(), 200u);
  EXPECT_NE(e->find("messages[0].role: '" + std::string(32, 'r') + "…' is not one of"),
            std::string::npos)
      << e->substr(0, 200);
  e = find_chat_messages_error(R"([{"role":"user","content":"x",")" + big + R"(":1}])",
                               JobLimits{});
  ASSERT_TRUE(e);
  EXPECT_LT(e->size(), 200u);
  EXPECT_NE(e->find("messages[0]." + std::string(32, 'r') + "…: unknown field"), std::string::npos)
      << e->substr(0, 200);
}

TEST_P(JobStoreTest, ChatTemplateKwargsAreStoredForChatJobsOnly) {
  JobSpec chat = text_job(R"([{"role":"user","content":"Hi"}])");
  chat.prompt_kind = PromptKind::Chat;
  chat.chat_template_kwargs = R"({"enable_thinking":false})";
  const int64_t id = store.submit(chat).id;
  EXPECT_EQ(store.get(id)->spec.chat_template_kwargs, chat.chat_template_kwargs);
  const auto claimed = store.claim("w", 1, milliseconds(1000));
  ASSERT_EQ(claimed.size(), 1u);  // a valid row passes the claim-time check too
  EXPECT_EQ(claimed[0].spec.chat_template_kwargs, chat.chat_template_kwargs);
  EXPECT_FALSE(store.get(store.submit(text_job("plain")).id)->spec.chat_template_kwargs);
  for (const char* bad : {"[1]", "{oops", "\"x\""}) {
    JobSpec s = chat;
    s.chat_template_kwargs = bad;
    EXPECT_THROW(store.submit(s), InputError) << bad;
  }
  JobSpec text = text_job("p");
  text.chat_template_kwargs = "{}";
  EXPECT_THROW(store.submit(text), InputError);
  chat.chat_template_kwargs = "{\"k\":\"" + std::string(5000, 'x') + "\"}";
  EXPECT_THROW(store.submit(chat), InputError);
}

TEST_P(JobStoreTest, SubmitManyIsAllOrNothing) {
  JobSpec bad = text_job("p");
  bad.sampling.max_tokens = 0;
  try {
    store.submit_many({text_job("a"), text_job("b"), bad});
    FAIL() << "accepted a bad batch";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("#2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(store.list({}).empty());
  size_t last_progress = 0;
  auto ids =
      store.submit_many({text_job("a"), text_job("b")}, [&](size_t n) { last_progress = n; });
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(last_progress, 2u);
  EXPECT_EQ(store.list({}).size(), 2u);
}

TEST_P(JobStoreTest, ClaimOrdersByPriorityThenAge) {
  int64_t old_low = store.submit(text_job("old low")).id;
  clock->advance(10);
  int64_t new_high = store
                         .submit([] {
                           auto s = text_job("new high");
                           s.priority = 5;
                           return s;
                         }())
                         .id;
  clock->advance(10);
  int64_t newer_low = store.submit(text_job("newer low")).id;
  auto got = store.claim("w", 3, milliseconds(1000));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].id, new_high);
  EXPECT_EQ(got[1].id, old_low);
  EXPECT_EQ(got[2].id, newer_low);
  for (const Job& j : got) {
    EXPECT_EQ(j.state, JobState::Running);
    EXPECT_EQ(j.attempts, 1);
    EXPECT_EQ(j.lease_owner, "w");
    EXPECT_EQ(j.lease_expires_at, clock->now_ms() + 1000);
  }
  EXPECT_TRUE(store.claim("w2", 5, milliseconds(1000)).empty());
}

TEST_P(JobStoreTest, CompleteRecordsResultAndLatencyOnceForTheLeaseOwner) {
  int64_t id = store.submit(text_job("p")).id;
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  JobResult res{"out", 3, 2, "length", kT0 + 5};
  LatencyRecord lat{1, 5, 10, 20, 200.0};
  EXPECT_FALSE(store.complete("intruder", id, res, lat));
  clock->advance(20);
  EXPECT_TRUE(store.complete("w", id, res, lat));
  EXPECT_FALSE(store.complete("w", id, JobResult{"again", 1, 1, "stop", {}}, lat));
  auto j = store.get(id);
  ASSERT_TRUE(j && j->result);
  EXPECT_EQ(j->state, JobState::Done);
  EXPECT_EQ(j->result->text, "out");
  EXPECT_EQ(j->result->completion_tokens, 2);
  EXPECT_EQ(j->result->finish_reason, "length");
  EXPECT_EQ(j->finished_at, kT0 + 20);
  EXPECT_FALSE(j->lease_owner.has_value());
  EXPECT_EQ(store.fail("w", id, "late", true), FailOutcome::NotOwner);
  EXPECT_FALSE(store.cancel(id));
  QueueStats st = store.stats();
  EXPECT_EQ(st.counts[JobState::Done], 1);
  EXPECT_EQ(st.total_ms.count, 1);
  EXPECT_DOUBLE_EQ(st.total_ms.p50, 20);
  EXPECT_DOUBLE_EQ(st.tokens_per_s.max, 200.0);
}

TEST_P(JobStoreTest, ExpiredLeaseIsTakenOverAndStaleWorkerCannotFinish) {
  int64_t id = store.submit(text_job("p")).id;
  ASSERT_EQ(store.claim("old", 1, milliseconds(1000)).size(), 1u);
  clock->advance(999);
  EXPECT_TRUE(store.claim("new", 1, milliseconds(1000)).empty()) << "lease still valid";
  EXPECT_EQ(store.renew("old", {id}, milliseconds(1000)), 1);
  clock->advance(999);
  EXPECT_TRUE(store.claim("new", 1, milliseconds(1000)).empty()) << "renewed lease still valid";
  clock->advance(2);
  auto got = store.claim("new", 1, milliseconds(1000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].attempts, 2);
  EXPECT_NE(got[0].error.value_or("").find("lease of old expired"), std::string::npos);
  EXPECT_EQ(store.renew("old", {id}, milliseconds(1000)), 0);
  EXPECT_FALSE(store.complete("old", id, JobResult{"stale", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.fail("old", id, "stale", false), FailOutcome::NotOwner);
  EXPECT_EQ(store.release("old", {id}), 0);
  EXPECT_TRUE(store.complete("new", id, JobResult{"fresh", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.get(id)->result->text, "fresh");
}

TEST_P(JobStoreTest, RequeueExpiredFailsJobsOutOfAttempts) {
  JobSpec s = text_job("poison");
  s.max_attempts = 2;
  int64_t id = store.submit(s).id;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(store.claim("w", 1, milliseconds(100)).size(), 1u) << "attempt " << i;
    clock->advance(101);
  }
  EXPECT_EQ(store.requeue_expired(), 1);
  auto j = store.get(id);
  EXPECT_EQ(j->state, JobState::Failed);
  EXPECT_NE(j->error->find("max_attempts"), std::string::npos) << *j->error;
  EXPECT_EQ(store.requeue_expired(), 0);
}

TEST_P(JobStoreTest, RetryableFailureBacksOffThenGivesUp) {
  JobSpec s = text_job("flaky");
  s.max_attempts = 2;
  int64_t id = store.submit(s).id;
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  EXPECT_EQ(store.fail("w", id, "oom", true), FailOutcome::Retrying);
  auto j = store.get(id);
  EXPECT_EQ(j->state, JobState::Queued);
  EXPECT_EQ(j->not_before, kT0 + store.options().retry.base_backoff_ms);
  EXPECT_TRUE(store.claim("w", 1, milliseconds(1000)).empty()) << "claimed during backoff";
  clock->advance(store.options().retry.base_backoff_ms);
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  EXPECT_EQ(store.fail("w", id, "oom", true), FailOutcome::Failed);
  j = store.get(id);
  EXPECT_EQ(j->state, JobState::Failed);
  EXPECT_EQ(*j->error, "oom (gave up after 2 attempts)");
}

TEST_P(JobStoreTest, NonRetryableFailureIsFinal) {
  int64_t id = store.submit(text_job("p")).id;
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  EXPECT_EQ(store.fail("w", id, "prompt too long for context", false), FailOutcome::Failed);
  EXPECT_EQ(store.get(id)->error, "prompt too long for context");
  EXPECT_TRUE(store.claim("w", 1, milliseconds(1000)).empty());
}

TEST_P(JobStoreTest, ReleaseGivesTheAttemptBack) {
  int64_t id = store.submit(text_job("p")).id;
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  EXPECT_EQ(store.release("w", {id}), 1);
  auto j = store.get(id);
  EXPECT_EQ(j->state, JobState::Queued);
  EXPECT_EQ(j->attempts, 0);
  EXPECT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
}

TEST_P(JobStoreTest, CancelQueuedAndRunningButNotFinal) {
  int64_t queued = store.submit(text_job("a")).id;
  int64_t running = store.submit(text_job("b")).id;
  store.claim("w", 1, milliseconds(1000));
  EXPECT_TRUE(store.cancel(queued));
  EXPECT_TRUE(store.cancel(running));
  EXPECT_FALSE(store.cancel(running));
  EXPECT_FALSE(store.cancel(999999));
  EXPECT_FALSE(store.complete("w", running, JobResult{"x", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.get(running)->state, JobState::Cancelled);
  EXPECT_TRUE(store.claim("w", 5, milliseconds(1000)).empty());
}

TEST_P(JobStoreTest, CompleteManyLandsOnlyOwnedJobs) {
  auto ids = store.submit_many({text_job("a"), text_job("b"), text_job("c")});
  ASSERT_EQ(store.claim("w", 2, milliseconds(1000)).size(), 2u);
  std::vector<Completion> cs;
  for (auto& r : ids)
    cs.push_back({r.id, JobResult{"r" + std::to_string(r.id), 1, 1, "stop", {}}, {}});
  auto ok = store.complete_many("w", cs);
  EXPECT_EQ(ok, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(store.stats().counts[JobState::Done], 2);
  EXPECT_EQ(store.get(ids[2].id)->state, JobState::Queued);
}

TEST_P(JobStoreTest, CompleteManyStoresEachResultAndLatencyExactly) {
  // Texts an array literal or a CSV would mangle, NULL and non-NULL timings side by side, and
  // a job listed twice (its first entry counts).
  const std::vector<std::string> texts = {"a\"b", "back\\slash", "{x,y}", "NULL", "",
                                          "line\nbreak\ttab", "\u00e9\u6f22\U0001f642"};
  std::vector<JobSpec> specs;
  for (size_t i = 0; i < texts.size(); ++i) specs.push_back(text_job("p" + std::to_string(i)));
  auto ids = store.submit_many(specs);
  ASSERT_EQ(store.claim("w", 100, milliseconds(1000)).size(), texts.size());
  std::vector<Completion> cs;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    LatencyRecord l{10 + k, std::nullopt, std::nullopt, 100 + k, std::nullopt};
    if (i % 2) l = LatencyRecord{20 + k, 3 + k, 40 + k, 200 + k, 12.5 + k};
    std::optional<int64_t> first_token_at;
    if (i % 3 == 0) first_token_at = 5000 + k;
    cs.push_back({ids[i].id, JobResult{texts[i], 7 + k, 1 + k, i % 2 ? "length" : "stop",
                                       first_token_at},
                  l});
  }
  cs.push_back({ids[0].id, JobResult{"second entry", 1, 1, "stop", {}}, {}});
  const std::vector<bool> ok = store.complete_many("w", cs);
  std::vector<bool> want(texts.size(), true);
  want.push_back(false);
  EXPECT_EQ(ok, want);
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE(i);
    const auto j = store.get(ids[i].id);
    ASSERT_TRUE(j && j->result);
    EXPECT_EQ(j->state, JobState::Done);
    EXPECT_EQ(j->result->text, texts[i]);
    EXPECT_EQ(j->result->prompt_tokens, cs[i].result.prompt_tokens);
    EXPECT_EQ(j->result->completion_tokens, cs[i].result.completion_tokens);
    EXPECT_EQ(j->result->finish_reason, cs[i].result.finish_reason);
    EXPECT_EQ(j->result->first_token_at, cs[i].result.first_token_at);
    const auto l = store.latency(ids[i].id);
    ASSERT_TRUE(l);
    EXPECT_EQ(l->queue_wait_ms, cs[i].latency.queue_wait_ms);
    EXPECT_EQ(l->ttft_ms, cs[i].latency.ttft_ms);
    EXPECT_EQ(l->decode_ms, cs[i].latency.decode_ms);
    EXPECT_EQ(l->total_ms, cs[i].latency.total_ms);
    EXPECT_EQ(l->tokens_per_s, cs[i].latency.tokens_per_s);
  }
}

TEST_P(JobStoreTest, BatchFilesSpanPagesAndAreBounded) {
  // 100 jobs of 100 KB answers (10 MB: two of batch_files' 8 MiB pages), every tenth failed.
  std::vector<JobSpec> specs;
  for (int i = 0; i < 100; ++i) {
    specs.push_back(text_job("p", "big" + std::to_string(i)));
    specs.back().batch_id = "big";
    specs.back().custom_id = "c" + std::to_string(i);
  }
  const auto ids = store.submit_many(specs);
  ASSERT_EQ(store.claim("w", 100, milliseconds(60000)).size(), 100u);
  for (int i = 0; i < 100; ++i) {
    if (i % 10 == 9)
      ASSERT_EQ(store.fail("w", ids[i].id, "boom", false), FailOutcome::Failed);
    else
      ASSERT_TRUE(store.complete("w", ids[i].id, JobResult{std::string(100'000, 'a' + i % 26), 1, 1, "stop", {}}, {}));
  }
  const BatchFiles f = batch_files(store, "big", size_t{64} << 20);
  std::vector<std::string> out_ids, err_ids;
  for (const auto& [text, to] : {std::pair{&f.output, &out_ids}, std::pair{&f.errors, &err_ids}}) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);)
      to->push_back(nlohmann::json::parse(line)["custom_id"].get<std::string>());
  }
  ASSERT_EQ(out_ids.size(), 90u);
  ASSERT_EQ(err_ids.size(), 10u);
  EXPECT_EQ(out_ids.front(), "c0");
  EXPECT_EQ(out_ids.back(), "c98");
  EXPECT_EQ(err_ids.back(), "c99");
  EXPECT_GT(f.output.size(), size_t{9'000'000});
  // Past the bound: refused naming the way out.
  try {
    (void)batch_files(store, "big", size_t{1} << 20);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("moebatch export --batch big"), std::string::npos) << e.what();
  }
}

TEST_P(JobStoreTest, ExportPagesWalkABatchInIdOrderWithinTheirBounds) {
  std::vector<JobSpec> specs;
  for (int i = 0; i < 5; ++i) {
    specs.push_back(text_job("p" + std::to_string(i), "k" + std::to_string(i)));
    specs.back().batch_id = "exp";
    specs.back().custom_id = "c" + std::to_string(i);
  }
  specs.push_back(text_job("other batch"));
  const auto ids = store.submit_many(specs);
  ASSERT_EQ(store.claim("w", 3, milliseconds(1000)).size(), 3u);
  ASSERT_TRUE(store.complete("w", ids[0].id, JobResult{std::string(300, 'x'), 1, 1, "stop", {}},
                             {}));
  ASSERT_EQ(store.fail("w", ids[1].id, "boom", false), FailOutcome::Failed);
  ASSERT_TRUE(store.complete("w", ids[2].id, JobResult{"short", 1, 1, "stop", {}}, {}));
  ASSERT_TRUE(store.cancel(ids[3].id));  // ids[4] stays queued

  // Two jobs a page: three pages, the last one short; lines keep the jobs' order.
  BatchExportPage p = batch_export_page(store, "exp", 0, 2, 1 << 20);
  ASSERT_EQ(p.lines.size(), 2u);
  EXPECT_TRUE(p.lines[0].done);
  EXPECT_EQ(p.lines[0].line["custom_id"], "c0");
  EXPECT_FALSE(p.lines[1].done);
  EXPECT_EQ(p.lines[1].line["error"]["message"], "boom");
  EXPECT_EQ(p.last_id, ids[1].id);
  EXPECT_TRUE(p.more);
  p = batch_export_page(store, "exp", *p.last_id, 2, 1 << 20);
  ASSERT_EQ(p.lines.size(), 2u);
  EXPECT_TRUE(p.lines[0].done);
  EXPECT_EQ(p.lines[1].line["error"]["code"], "cancelled");
  p = batch_export_page(store, "exp", *p.last_id, 2, 1 << 20);
  EXPECT_TRUE(p.lines.empty());
  EXPECT_EQ(p.unfinished, 1);
  EXPECT_EQ(p.last_id, ids[4].id);
  EXPECT_FALSE(p.more);
  EXPECT_FALSE(batch_export_page(store, "exp", ids[4].id, 2, 1 << 20).last_id);
  // One page over the whole batch (read a few rows at a time inside).
  p = batch_export_page(store, "exp", 0, 1000, 1 << 20);
  EXPECT_EQ(p.lines.size(), 4u);
  EXPECT_EQ(p.unfinished, 1);
  EXPECT_FALSE(p.more);

  // A byte bound smaller than the first line still yields that line, then ends the page.
  p = batch_export_page(store, "exp", 0, 100, 10);
  ASSERT_EQ(p.lines.size(), 1u);
  EXPECT_EQ(p.lines[0].line["custom_id"], "c0");
  EXPECT_EQ(p.last_id, ids[0].id);
  EXPECT_TRUE(p.more);

  // The wire form round-trips; a malformed one is refused, as is a "more" that cannot advance.
  const BatchExportPage back = batch_export_page_from_json(batch_export_page_to_json(p));
  ASSERT_EQ(back.lines.size(), 1u);
  EXPECT_EQ(back.lines[0].line, p.lines[0].line);
  EXPECT_EQ(back.lines[0].done, p.lines[0].done);
  EXPECT_EQ(back.last_id, p.last_id);
  EXPECT_EQ(back.more, p.more);
  nlohmann::json bad = batch_export_page_to_json(p);
  bad["last_id"] = nullptr;
  EXPECT_THROW(batch_export_page_from_json(bad), Error);
  bad = batch_export_page_to_json(p);
  bad["lines"] = nlohmann::json::array({1});
  EXPECT_THROW(batch_export_page_from_json(bad), Error);
  bad = batch_export_page_to_json(p);
  bad["unfinished"] = -1;
  EXPECT_THROW(batch_export_page_from_json(bad), Error);
  EXPECT_THROW(batch_export_page_from_json(nlohmann::json::array()), Error);
}

TEST_P(JobStoreTest, ListFiltersByStateAndBatch) {
  JobSpec a = text_job("a");
  a.batch_id = "B1";
  JobSpec b = text_job("b");
  b.batch_id = "B2";
  store.submit_many({a, b, a});
  store.claim("w", 1, milliseconds(1000));
  ListFilter f;
  f.batch_id = "B1";
  EXPECT_EQ(store.list(f).size(), 2u);
  f.state = JobState::Running;
  EXPECT_EQ(store.list(f).size(), 1u);
  ListFilter page;
  page.limit = 1;
  page.after_id = store.list(page).at(0).id;
  EXPECT_EQ(store.list(page).size(), 1u);
  page.limit = 0;
  EXPECT_THROW(store.list(page), InputError);
}

TEST_P(JobStoreTest, DataVersionMovesOnlyForOtherConnections) {
  JobStore other(store_options(location(), clock));
  int64_t v0 = store.data_version();
  store.submit(text_job("own write"));
  EXPECT_EQ(store.data_version(), v0);
  other.submit(text_job("other write"));
  // SQLite sees the commit at once; a PostgreSQL NOTIFY arrives a moment after it.
  int64_t v1 = store.data_version();
  for (int i = 0; i < 200 && v1 == v0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    v1 = store.data_version();
  }
  EXPECT_NE(v1, v0);
}

TEST_P(JobStoreTest, StatsPercentilesUseNearestRank) {
  std::vector<Completion> cs;
  for (int i = 1; i <= 10; ++i) {
    int64_t id = store.submit(text_job("p" + std::to_string(i))).id;
    cs.push_back({id, JobResult{"r", 1, 1, "stop", {}}, LatencyRecord{i * 10, i, i, i * 100, {}}});
  }
  store.claim("w", 10, milliseconds(1000));
  store.complete_many("w", cs);
  QueueStats st = store.stats();
  EXPECT_EQ(st.queue_wait_ms.count, 10);
  EXPECT_DOUBLE_EQ(st.queue_wait_ms.p50, 50);
  EXPECT_DOUBLE_EQ(st.queue_wait_ms.p90, 90);
  EXPECT_DOUBLE_EQ(st.queue_wait_ms.p99, 100);
  EXPECT_EQ(st.tokens_per_s.count, 0);
}

TEST_P(JobStoreTest, StatsCountEveryStateFromTheIndexes) {
  // Done is what count(*) leaves after the other four: check every state against a known mix.
  std::vector<int64_t> ids;
  for (int i = 0; i < 9; ++i) ids.push_back(store.submit(text_job("p" + std::to_string(i))).id);
  const auto claimed = store.claim("w", 5, milliseconds(60000));
  ASSERT_EQ(claimed.size(), 5u);
  std::vector<Completion> cs;
  for (size_t i = 0; i < 3; ++i) {
    cs.push_back({claimed[i].id, JobResult{"r", 1, 1, "stop", {}}, LatencyRecord{1, 1, 1, 1, {}}});
  }
  ASSERT_EQ(store.complete_many("w", cs), std::vector<bool>(3, true));
  ASSERT_EQ(store.fail("w", claimed[3].id, "bad", false), FailOutcome::Failed);
  int64_t cancelled = 0;
  for (int64_t id : ids) {
    if (cancelled < 2 && store.get(id)->state == JobState::Queued && store.cancel(id)) ++cancelled;
  }
  const QueueStats st = store.stats();
  EXPECT_EQ(st.counts.at(JobState::Queued), 2);
  EXPECT_EQ(st.counts.at(JobState::Running), 1);
  EXPECT_EQ(st.counts.at(JobState::Done), 3);
  EXPECT_EQ(st.counts.at(JobState::Failed), 1);
  EXPECT_EQ(st.counts.at(JobState::Cancelled), 2);
  EXPECT_EQ(st.total_ms.count, 3);
}

TEST_P(JobStoreTest, StatsPercentilesCoverTheNewestDoneJobsOnly) {
  StoreOptions o = store_options(location(), clock);
  o.stats_latency_window = 4;
  JobStore windowed(o);
  std::vector<Completion> cs;
  for (int i = 1; i <= 10; ++i) {
    int64_t id = store.submit(text_job("p" + std::to_string(i))).id;
    cs.push_back({id, JobResult{"r", 1, 1, "stop", {}},
                  LatencyRecord{i, i, i, i * 100, static_cast<double>(i)}});
  }
  ASSERT_EQ(store.claim("w", 10, milliseconds(60000)).size(), 10u);
  // Finished newest first: the window follows job ids, not the order results came in.
  std::reverse(cs.begin(), cs.end());
  store.complete_many("w", cs);
  const QueueStats st = windowed.stats();
  EXPECT_EQ(st.latency_window, 4);
  EXPECT_EQ(st.counts.at(JobState::Done), 10) << "the counts cover every job";
  EXPECT_EQ(st.total_ms.count, 4);
  EXPECT_DOUBLE_EQ(st.total_ms.p50, 800);  // nearest rank over 700, 800, 900, 1000
  EXPECT_DOUBLE_EQ(st.total_ms.max, 1000);
  EXPECT_DOUBLE_EQ(st.queue_wait_ms.p50, 8);
  EXPECT_EQ(st.tokens_per_s.count, 4);
  EXPECT_DOUBLE_EQ(st.tokens_per_s.p90, 10);
  const QueueStats all = store.stats();  // the default window holds them all
  EXPECT_EQ(all.latency_window, 10000);
  EXPECT_EQ(all.total_ms.count, 10);
  EXPECT_DOUBLE_EQ(all.total_ms.p50, 500);
  for (int64_t bad : {int64_t{0}, int64_t{1000001}}) {
    o.stats_latency_window = bad;
    EXPECT_THROW(JobStore{o}, Error) << bad;
  }
}

TEST_P(JobStoreTest, StatsStatementsReadIndexesNotRows) {
  // The plans of stats_sql on the real schema: no count may read the whole jobs table (its rows
  // hold prompts and results; millions of them took seconds), and the latency window is a
  // backward walk of job_latency's key, not a sort. PostgreSQL's choice between plans depends
  // on table statistics, so there the test only shows that an index applies.
  const std::string latency = std::string(stats_sql::kLatencyNewest) + "10000";
  const std::vector<std::pair<std::string, std::string>> expect = {
      {stats_sql::kAll, ""},
      {stats_sql::kQueued, "jobs_claim"},
      {stats_sql::kRunning, "jobs_running_lease"},
      {stats_sql::kFailedOrCancelled, "jobs_failed_or_cancelled"},
      {latency, postgres() ? "Index Scan Backward using job_latency_pkey" : ""}};
  for (const auto& [sql, index] : expect) {
    std::string plan;
    if (postgres()) {
      PgConn conn(location());
      conn.exec("SET enable_seqscan = off");  // a seq scan then means no index applies
      PgResult r = conn.exec("EXPLAIN " + sql);
      for (int i = 0; i < r.rows(); ++i) plan += r.text(i, 0) + "\n";
      EXPECT_EQ(plan.find("Seq Scan"), std::string::npos) << sql << "\n" << plan;
    } else {
      Db db(location());
      Stmt& q = db.prepare("EXPLAIN QUERY PLAN " + sql);
      while (q.step()) plan += q.text(3) + "\n";
      q.reset();
      const bool on_latency = sql == latency;
      EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << sql << "\n" << plan;
      if (!on_latency) {
        EXPECT_NE(plan.find("USING"), std::string::npos) << sql << "\n" << plan;
      }
    }
    if (!index.empty()) {
      EXPECT_NE(plan.find(index), std::string::npos) << sql << "\n" << plan;
    }
  }
}

TEST_P(JobStoreTest, FencingTokenRefusesAnOlderLeaseOfTheSameWorkerId) {
  // Two processes that (wrongly) share a worker id: the owner check alone cannot tell them
  // apart, the lease token can.
  JobStore twin(store_options(location(), clock));
  const int64_t id = store.submit(text_job("p")).id;
  auto first = store.claim("w", 1, milliseconds(100));
  ASSERT_EQ(first.size(), 1u);
  clock->advance(101);
  auto second = twin.claim("w", 1, milliseconds(1000));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GT(second[0].lease_token, first[0].lease_token);
  EXPECT_EQ(store.get(id)->lease_token, second[0].lease_token);
  EXPECT_EQ(store.renew("w", {id}, milliseconds(1000)), 0);
  EXPECT_EQ(store.not_held("w", {id}), std::vector<int64_t>{id});
  EXPECT_FALSE(store.complete("w", id, JobResult{"stale", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.fail("w", id, "stale", true), FailOutcome::NotOwner);
  EXPECT_EQ(store.release("w", {id}), 0);
  EXPECT_TRUE(twin.not_held("w", {id}).empty());
  EXPECT_TRUE(twin.complete("w", id, JobResult{"fresh", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.get(id)->result->text, "fresh");
}

TEST_P(JobStoreTest, TextRoundTripsExactly) {
  // Every storable byte sequence comes back unchanged, and text that is not storable on one
  // database is refused at submit instead of being stored altered.
  JobSpec s = text_job("tabs\tand \\ quotes ' \" \u00e9\u4e2d\U0001f600 \r\n", "k\u00e9y");
  s.sampling.stop = {"\n\n", "'\""};
  s.sampling.temperature = 0.1;
  s.sampling.top_p = 1.0 / 3.0;
  const int64_t id = store.submit(s).id;
  auto j = store.get(id);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->spec.prompt, s.prompt);
  EXPECT_EQ(j->spec.client_key, s.client_key);
  EXPECT_EQ(j->spec.sampling.stop, s.sampling.stop);
  EXPECT_EQ(j->spec.sampling.temperature, 0.1);
  EXPECT_EQ(j->spec.sampling.top_p, 1.0 / 3.0);
  EXPECT_EQ(store.get_by_key("k\u00e9y")->id, id);
  ASSERT_EQ(store.claim("w", 1, milliseconds(1000)).size(), 1u);
  // Model output may end inside a UTF-8 sequence; it is stored, never refused.
  const std::string cut = "ok \xe4\xb8";
  ASSERT_TRUE(store.complete("w", id, JobResult{cut, 1, 2, "length", {}}, {}));
  const std::string text = store.get(id)->result->text;
  if (postgres()) {
    EXPECT_EQ(text, "ok \xef\xbf\xbd\xef\xbf\xbd");  // U+FFFD for each stray byte
  } else {
    EXPECT_EQ(text, cut);
  }
  JobSpec nul = text_job(std::string("a\0b", 3));
  if (postgres()) {
    EXPECT_THROW(store.submit(nul), InputError);
  } else {
    EXPECT_EQ(store.get(store.submit(nul).id)->spec.prompt, nul.prompt);
  }
  EXPECT_FALSE(store.get_by_key(std::string("k\0", 2)).has_value());
}

TEST_P(JobStoreTest, RejectsBadClaimArguments) {
  EXPECT_THROW(store.claim("", 1, milliseconds(1000)), InputError);
  EXPECT_THROW(store.claim("w", 0, milliseconds(1000)), InputError);
  EXPECT_THROW(store.claim("w", 1, milliseconds(0)), InputError);
}

}  // namespace
}  // namespace moebatch
