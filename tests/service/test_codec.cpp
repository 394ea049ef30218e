// prepare_work / make_completion: tokenization with the chat template, limits (a bad job gets a
// reason, whatever it provokes, and its claim group runs), stop strings on text, the latency
// record (saturated, never overflowing, on hostile row times).
#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "engine/tokenizer/tokenizer.h"
#include "queue/job_store.h"
#include "service/job_codec.h"
#include "tests/common/files.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

const Tokenizer& tok() {
  static const Tokenizer t =
      Tokenizer::from_dir(std::filesystem::path(test::test_data_dir()) / "qwen3-tokenizer");
  return t;
}

// The bundled tokenizer with "(?:a|a)+b|" put in front of its pre-tokenizer regex: on a long run
// of 'a' PCRE2 gives up with its match-limit error (an Error, not an InputError), the failure a
// hostile prompt provokes; every other text splits as before.
void write_poisoned_tokenizer(const std::filesystem::path& dir) {
  const auto src = std::filesystem::path(test::test_data_dir()) / "qwen3-tokenizer";
  // Edited as text: parsing and dumping the 11 MB file would cost a second per test. The first
  // "Regex" of the file is the pre-tokenizer's (the vocabulary's token "Regex" comes later).
  std::string text = test::read_file(src / "tokenizer.json");
  const std::string anchor = "\"Regex\": \"";
  const size_t at = text.find(anchor);
  ASSERT_NE(at, std::string::npos);
  ASSERT_LT(at, text.find("\"vocab\""));
  text.insert(at + anchor.size(), "(?:a|a)+b|");
  std::filesystem::create_directories(dir);
  test::write_file(dir / "tokenizer.json", text);
  std::filesystem::copy_file(src / "tokenizer_config.json", dir / "tokenizer_config.json");
}

const std::string kPoisonPrompt = std::string(48, 'a');

Job make_job(PromptKind kind, std::string prompt, int64_t max_tokens) {
  Job j;
  j.id = 7;
  j.spec.prompt_kind = kind;
  j.spec.prompt = std::move(prompt);
  j.spec.sampling.max_tokens = max_tokens;
  j.spec.sampling.temperature = 0.5;
  j.spec.sampling.top_k = 3;
  return j;
}

TEST(Codec, ChatJobsAreRenderedWithTheTemplate) {
  IntakeLimits lim{4096, 4096, 151669};
  auto r = prepare_work(make_job(PromptKind::Chat, R"([{"role":"user","content":"Hi there"}])", 5),
                        tok(), lim);
  ASSERT_TRUE(std::holds_alternative<WorkItem>(r));
  const WorkItem& w = std::get<WorkItem>(r);
  const auto expect = tok().encode_chat({{"user", "Hi there", std::nullopt}});
  ASSERT_EQ(w.prompt.size(), expect.size());
  for (size_t i = 0; i < expect.size(); ++i)
    EXPECT_EQ(w.prompt[i], static_cast<int32_t>(expect[i]));
  EXPECT_EQ(w.max_tokens, 5);
  EXPECT_FLOAT_EQ(w.temperature, 0.5f);
  EXPECT_EQ(w.top_k, 3);
  EXPECT_FALSE(w.stop_ids.empty());  // <|im_end|> ends generation
  // No seed given: derived from the job id, so a rerun samples the same way.
  auto again = prepare_work(make_job(PromptKind::Chat, R"([{"role":"user","content":"Hi"}])", 5),
                            tok(), lim);
  EXPECT_EQ(std::get<WorkItem>(again).seed, w.seed);
}

TEST(Codec, BadJobsGetAReason) {
  IntakeLimits lim{16, 8, 151669};
  auto too_long = prepare_work(make_job(PromptKind::Text, "one two three", 14), tok(), lim);
  ASSERT_TRUE(std::holds_alternative<std::string>(too_long));
  EXPECT_NE(std::get<std::string>(too_long).find("exceeds the context limit of 16"),
            std::string::npos);
  auto big_prompt =
      prepare_work(make_job(PromptKind::Text, "a b c d e f g h i j k l m n o p", 1), tok(), lim);
  EXPECT_NE(std::get<std::string>(big_prompt).find("exceeds the limit of 8"), std::string::npos);
  auto zero = prepare_work(make_job(PromptKind::Text, "hi", 0), tok(), lim);
  EXPECT_NE(std::get<std::string>(zero).find("max_tokens"), std::string::npos);
  IntakeLimits small_vocab{4096, 4096, 100};
  auto vocab = prepare_work(make_job(PromptKind::Text, "zebra", 1), tok(), small_vocab);
  EXPECT_NE(std::get<std::string>(vocab).find("outside the model's vocabulary"), std::string::npos);
  auto chat = prepare_work(make_job(PromptKind::Chat, R"({"role":"user"})", 1), tok(), lim);
  EXPECT_NE(std::get<std::string>(chat).find("prompt"), std::string::npos);
}

TEST(Codec, AnyExceptionFromTokenizingBecomesThatJobsReason) {
  test::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_poisoned_tokenizer(dir.path() / "tok"));
  const Tokenizer poisoned = Tokenizer::from_dir(dir.path() / "tok");
  ASSERT_THROW(poisoned.encode(kPoisonPrompt, false), Error) << "the regex no longer trips PCRE2";
  IntakeLimits lim{4096, 4096, 151669};
  std::variant<WorkItem, std::string> r;
  ASSERT_NO_THROW(r = prepare_work(make_job(PromptKind::Text, kPoisonPrompt, 4), poisoned, lim));
  ASSERT_TRUE(std::holds_alternative<std::string>(r));
  const std::string& reason = std::get<std::string>(r);
  EXPECT_EQ(reason.rfind("prompt: cannot be tokenized: ", 0), 0u) << reason;
  EXPECT_NE(reason.find("match limit"), std::string::npos) << reason;
  // The same in a chat message; ordinary text still tokenizes.
  const std::string chat = R"([{"role":"user","content":")" + kPoisonPrompt + R"("}])";
  EXPECT_TRUE(std::holds_alternative<std::string>(
      prepare_work(make_job(PromptKind::Chat, chat, 4), poisoned, lim)));
  EXPECT_TRUE(std::holds_alternative<WorkItem>(
      prepare_work(make_job(PromptKind::Text, "a banana", 4), poisoned, lim)));
}

// The service end to end: a poison job claimed in one group with three good ones fails alone,
// at its first attempt, with its reason; the others run to done (before, the exception left the
// whole group leased and unrun).
TEST(Codec, PoisonJobFailsAloneInItsClaimGroup) {
  test::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_poisoned_tokenizer(dir.path() / "tok"));
  ServiceConfig cfg = test::demo_service_config(dir.path());
  cfg.tokenizer = (dir.path() / "tok").string();
  cfg.max_num_seqs = 4;
  cfg.max_num_batched_tokens = 256;
  cfg.warmup_seqs = 1;
  JobStore store(test::store_options(cfg.db));
  std::vector<JobSpec> specs;
  for (const std::string& prompt : {std::string("first good one"), kPoisonPrompt,
                                    std::string("second good one"), std::string("third")}) {
    JobSpec s = test::text_job(prompt);
    s.sampling.max_tokens = 3;
    s.sampling.temperature = 0;
    specs.push_back(s);
  }
  // Queued before the service starts, so its first claim takes all four together.
  const std::vector<SubmitResult> ids = store.submit_many(specs);
  test::RunningService run(cfg);
  const bool settled = test::wait_until(
      [&] {
        const QueueStats st = store.stats();
        return st.counts.at(JobState::Done) + st.counts.at(JobState::Failed) == 4;
      },
      std::chrono::seconds(20));
  ASSERT_TRUE(settled) << "the claim group did not finish";
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::optional<Job> j = store.get(ids[i].id);
    ASSERT_TRUE(j);
    EXPECT_EQ(j->attempts, 1) << i;
    if (i == 1) {
      EXPECT_EQ(j->state, JobState::Failed);
      ASSERT_TRUE(j->error);
      EXPECT_NE(j->error->find("cannot be tokenized"), std::string::npos) << *j->error;
    } else {
      EXPECT_EQ(j->state, JobState::Done) << i << ": " << j->error.value_or("");
    }
  }
  EXPECT_EQ(run.stop(), 0);
}

TEST(Codec, HostileRowTimesSaturateInsteadOfOverflowing) {
  // enqueued_at is producer-writable: INT64_MIN made started_at - enqueued_at overflow.
  WorkResult r;
  r.tokens = {static_cast<int32_t>(tok().encode("ok")[0])};
  r.ttft_s = 0.5;
  r.total_s = 1.0;
  InFlightJob past{std::numeric_limits<int64_t>::min(), 1250, {}, std::nullopt, std::nullopt};
  Completion c = make_completion(r, past, tok());
  EXPECT_EQ(c.latency.queue_wait_ms, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(c.latency.total_ms, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*c.result.first_token_at, 1250 + 500);
  // A start at the end of time: the first token's time saturates too.
  InFlightJob late{0, std::numeric_limits<int64_t>::max(), {}, std::nullopt, std::nullopt};
  EXPECT_EQ(*make_completion(r, late, tok()).result.first_token_at,
            std::numeric_limits<int64_t>::max());
  // An enqueue time after the start (clock skew between producer and service) is no wait.
  InFlightJob skewed{5000, 1000, {}, std::nullopt, std::nullopt};
  EXPECT_EQ(make_completion(r, skewed, tok()).latency.queue_wait_ms, 0);
}

TEST(Codec, CompletionAppliesStopStringsAndRecordsLatency) {
  const auto ids = tok().encode("Hello world. STOP here");
  WorkResult r;
  r.job_id = 9;
  for (auto id : ids) r.tokens.push_back(static_cast<int32_t>(id));
  r.prompt_tokens = 4;
  r.handoff_s = 0.010;
  r.ttft_s = 0.100;
  r.total_s = 0.600;
  InFlightJob job{1000, 1250, {"STOP"}, std::nullopt, std::nullopt};
  Completion c = make_completion(r, job, tok());
  EXPECT_EQ(c.result.text, "Hello world. ");
  EXPECT_EQ(c.result.finish_reason, "stop");
  EXPECT_EQ(c.result.completion_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(c.latency.queue_wait_ms, 250);
  EXPECT_EQ(*c.latency.ttft_ms, 110);
  EXPECT_EQ(*c.latency.decode_ms, 500);
  EXPECT_EQ(c.latency.total_ms, 250 + 610);
  EXPECT_NEAR(*c.latency.tokens_per_s, (ids.size() - 1) / 0.5, 1e-9);
  EXPECT_EQ(*c.result.first_token_at, 1250 + 110);

  // Ending on the eos token: "stop", and the token's text is not part of the answer; an id
  // beyond the tokenizer (a padded model vocabulary) becomes U+FFFD instead of failing the job.
  WorkResult e;
  e.tokens = {static_cast<int32_t>(tok().encode("ok")[0]), 151700,
              static_cast<int32_t>(tok().eos_ids()[0])};
  e.hit_stop_token = true;
  Completion ce = make_completion(e, InFlightJob{}, tok());
  EXPECT_EQ(ce.result.text, "ok\xEF\xBF\xBD");
  EXPECT_EQ(ce.result.finish_reason, "stop");
  WorkResult l;
  l.tokens = {static_cast<int32_t>(tok().encode("ok")[0])};
  EXPECT_EQ(make_completion(l, InFlightJob{}, tok()).result.finish_reason, "length");
}

}  // namespace
}  // namespace moebatch
