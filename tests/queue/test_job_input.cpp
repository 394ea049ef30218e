// Job input read the way the engine will read it: sampling values checked in the engine's float
// precision, JSON with duplicate or NUL-holding keys refused with a reason (chat messages,
// chat_template_kwargs, OpenAI Batch lines), and max_tokens given twice refused.
#include <gtest/gtest.h>

#include "common/error.h"
#include "queue/job_validate.h"
#include "queue/json_strict.h"
#include "queue/openai_batch.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

std::string error_of(const JobSpec& s) { return find_job_spec_error(s, JobLimits{}).value_or(""); }

TEST(QueueJobInput, SamplingValuesAreCheckedInTheEnginesFloatPrecision) {
  JobSpec s = test::text_job("p");
  s.sampling.top_p = 1e-300;  // > 0 as a double, 0 as the engine's float
  EXPECT_NE(error_of(s).find("top_p: 1e-300 is too small"), std::string::npos) << error_of(s);
  s.sampling.top_p = 1e-40;  // subnormal as a float
  EXPECT_NE(error_of(s).find("top_p"), std::string::npos);
  s.sampling.top_p = 1e-30;
  EXPECT_EQ(error_of(s), "");
  s.sampling.temperature = 1e-300;
  EXPECT_NE(error_of(s).find("temperature: 1e-300 is too small"), std::string::npos) << error_of(s);
  s.sampling.temperature = 1e-45;
  EXPECT_NE(error_of(s).find("temperature"), std::string::npos);
  s.sampling.temperature = 0;  // greedy stays allowed
  EXPECT_EQ(error_of(s), "");
  s.sampling.temperature = 1e-20;
  EXPECT_EQ(error_of(s), "");
}

TEST(QueueJobInput, DuplicateAndNulKeysAreRefused) {
  std::string problem;
  EXPECT_TRUE(parse_json_strict(R"({"a":1,"b":{"a":2}})", &problem).is_object());
  EXPECT_EQ(problem, "");
  EXPECT_TRUE(parse_json_strict(R"({"a":1,"a":2})", &problem).is_discarded());
  EXPECT_EQ(problem, "duplicate key 'a'");
  EXPECT_TRUE(parse_json_strict(R"([{"x":{"y":1,"y":1}}])", &problem).is_discarded());
  EXPECT_EQ(problem, "duplicate key 'y'");
  EXPECT_TRUE(parse_json_strict(R"({"a\u0000b":1})", &problem).is_discarded());
  EXPECT_EQ(problem, "key 'a\\x00b' holds a NUL byte");
  EXPECT_TRUE(parse_json_strict("{oops", &problem).is_discarded());
  EXPECT_EQ(problem, "not valid JSON");

  JobSpec chat = test::text_job(R"([{"role":"user","role":"system","content":"hi"}])");
  chat.prompt_kind = PromptKind::Chat;
  EXPECT_NE(error_of(chat).find("duplicate key 'role'"), std::string::npos) << error_of(chat);
  chat.prompt = R"([{"role":"user","content":"hi","n\u0000ame":"x"}])";
  EXPECT_NE(error_of(chat).find("NUL"), std::string::npos) << error_of(chat);
  chat.prompt = R"([{"role":"user","content":"hi"}])";
  chat.chat_template_kwargs = R"({"enable_thinking":true,"enable_thinking":false})";
  EXPECT_NE(error_of(chat).find("chat_template_kwargs: duplicate key"), std::string::npos)
      << error_of(chat);
}

TEST(QueueJobInput, BatchLinesWithAmbiguousFieldsAreRefused) {
  const JobLimits limits;
  auto reason = [&](const std::string& line) {
    try {
      parse_batch_line(line, 3, "b", limits);
      return std::string();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
  };
  const std::string head = R"({"custom_id":"c","method":"POST","url":"/v1/chat/completions",)";
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(reason(head + R"("body":{)" + msgs + R"(,"max_tokens":5}})"), "");
  EXPECT_NE(reason(head + R"("body":{)" + msgs + R"(,"max_tokens":5,"max_completion_tokens":9}})")
                .find("not both"),
            std::string::npos);
  EXPECT_NE(reason(head + R"("body":{)" + msgs + R"(,"max_tokens":5,"max_tokens":9}})")
                .find("line 3: line: duplicate key 'max_tokens'"),
            std::string::npos);
  EXPECT_NE(reason(head + R"("body":{)" + msgs + R"(},"custom_id":"d"})").find("duplicate key"),
            std::string::npos);
  EXPECT_NE(reason(head + R"("body":{)" + msgs + R"(,"top_p\u0000":1}})").find("NUL"),
            std::string::npos);
}

}  // namespace
}  // namespace moebatch
