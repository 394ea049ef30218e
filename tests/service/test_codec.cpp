// prepare_work / make_completion: tokenization with the chat template, limits (a bad job gets a
// reason), stop strings on text, the latency record.
#include <gtest/gtest.h>

#include "engine/tokenizer/tokenizer.h"
#include "service/job_codec.h"
#include "tests/common/files.h"

namespace moebatch {
namespace {

const Tokenizer& tok() {
  static const Tokenizer t =
      Tokenizer::from_dir(std::filesystem::path(test::test_data_dir()) / "qwen3-tokenizer");
  return t;
}

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
