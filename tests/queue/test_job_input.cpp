// Job input read the way the engine will read it: sampling values checked in the engine's float
// precision, JSON with duplicate or NUL-holding keys refused with a reason (chat messages,
// chat_template_kwargs, OpenAI Batch lines), and max_tokens given twice refused.
#include <gtest/gtest.h>

#include <fstream>
#include <variant>

#include "common/error.h"
#include "queue/job_validate.h"
#include "queue/json_strict.h"
#include "queue/openai_batch.h"
#include "tests/common/files.h"
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
  // Deep nesting (a ZeroMQ request or batch line of "[[[…"): refused, not built.
  EXPECT_TRUE(
      parse_json_strict(
          R"({"metadata":)" + std::string(200000, '[') + std::string(200000, ']') + "}", &problem)
          .is_discarded());
  EXPECT_EQ(problem, "nested deeper than 128 levels");
  // A long key is quoted cut at a character boundary ("é" is two bytes; 64 would split one).
  const std::string accented = "a" + [] {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "\xc3\xa9";
    return s;
  }();
  EXPECT_TRUE(parse_json_strict("{\"" + accented + "\":1,\"" + accented + "\":2}", &problem)
                  .is_discarded());
  EXPECT_EQ(problem, "duplicate key '" + accented.substr(0, 63) + "...'");
  EXPECT_NO_THROW((void)nlohmann::json(problem).dump());

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

// An OpenAI request line for /v1/chat/completions with these extra body members.
std::string chat_line(const std::string& custom_id, const std::string& extra) {
  return R"({"custom_id":")" + custom_id +
         R"(","method":"POST","url":"/v1/chat/completions","body":{"model":"m",)" +
         R"("messages":[{"role":"user","content":"hi"}])" + extra + "}}";
}

TEST(QueueJobInput, BatchLinesHonourOpenAiFieldsTheEngineSupports) {
  const JobLimits limits;
  auto spec = [&](const std::string& line) {
    auto r = parse_batch_request(line, 1, "b", limits);
    if (auto* e = std::get_if<BatchLineError>(&r)) ADD_FAILURE() << e->text();
    return std::holds_alternative<JobSpec>(r) ? std::get<JobSpec>(r) : JobSpec{};
  };
  // Text content parts are joined by newlines; user and metadata are kept.
  JobSpec s = spec(R"({"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{)"
                   R"("messages":[{"role":"user","content":[{"type":"text","text":"a"},)"
                   R"({"type":"text","text":"b"}]}],"user":"u-1","metadata":{"k":"v"}}})");
  EXPECT_EQ(s.prompt, R"([{"content":"a\nb","role":"user"}])");
  EXPECT_EQ(s.user, "u-1");
  EXPECT_EQ(s.metadata, R"({"k":"v"})");
  // What SDKs send by default is accepted and changes nothing.
  s = spec(chat_line("c", R"(,"frequency_penalty":0,"presence_penalty":0.0,"logprobs":false,)"
                          R"("response_format":{"type":"text"},"tools":[],"store":false,)"
                          R"("top_k":-1,"stop":null,"n":1,"stream":false,"logit_bias":{})"));
  EXPECT_EQ(s.sampling.top_k, 0);
  EXPECT_TRUE(s.sampling.stop.empty());
  s = spec(R"({"custom_id":"c","method":"POST","url":"/v1/completions","body":{)"
           R"("prompt":["one"],"echo":false,"best_of":1,"suffix":null}})");
  EXPECT_EQ(s.prompt, "one");
}

TEST(QueueJobInput, BatchLineErrorsNameTheLineAndTheField) {
  const JobLimits limits;
  auto error = [&](const std::string& line) {
    auto r = parse_batch_request(line, 7, "b", limits);
    return std::holds_alternative<BatchLineError>(r) ? std::get<BatchLineError>(r)
                                                     : BatchLineError{};
  };
  BatchLineError e = error(chat_line("c", R"(,"frequency_penalty":0.5)"));
  EXPECT_EQ(e.line, 7u);
  EXPECT_EQ(e.field, "body.frequency_penalty");
  EXPECT_EQ(e.custom_id, "c");
  EXPECT_EQ(e.text(), "line 7: body.frequency_penalty: not supported by this engine (only 0)");
  EXPECT_EQ(error(chat_line("c", R"(,"response_format":{"type":"json_object"})")).field,
            "body.response_format");
  EXPECT_EQ(error(chat_line("c", R"(,"tools":[{"type":"function"}])")).field, "body.tools");
  EXPECT_EQ(error(chat_line("c", R"(,"colour":"red")")).message, "unknown field");
  EXPECT_EQ(error(chat_line("c", R"(,"metadata":{"k":1})")).field, "body.metadata");
  EXPECT_EQ(error(chat_line("c", R"(,"max_tokens":0)")).field, "max_tokens");
  e = error(R"({"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{)"
            R"("messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}})");
  EXPECT_EQ(e.text(),
            "line 7: body.messages[0].content[0].type: 'image_url' is not supported (text only)");
  e = error("{not json");
  EXPECT_EQ(e.field, "line");
  EXPECT_FALSE(e.custom_id);
}

TEST(QueueJobInput, BatchFileKeepsGoodLinesAndReportsBadOnesInOpenAiErrorLines) {
  test::TempDir dir;
  const auto path = dir.path() / "in.jsonl";
  std::ofstream(path) << chat_line("a", "") << "\n"
                      << chat_line("b", R"(,"user":17)") << "\n\n"
                      << chat_line("a", "") << "\n"
                      << chat_line("c", R"(,"user":"u")") << "\n";
  BatchFileLimits fl;
  BatchFile f = read_batch_file(path, "in", JobLimits{}, fl);
  ASSERT_EQ(f.specs.size(), 2u);
  EXPECT_EQ(f.spec_lines, (std::vector<size_t>{1, 5}));
  ASSERT_EQ(f.errors.size(), 2u);
  EXPECT_EQ(f.errors[0].text(), "line 2: body.user: must be a string");
  EXPECT_EQ(f.errors[1].text(), "line 4: custom_id: 'a' repeats an earlier line");
  const nlohmann::json line = batch_error_line(f.errors[0]);
  EXPECT_EQ(line["custom_id"], "b");
  EXPECT_EQ(line["error"], nullptr);
  EXPECT_EQ(line["response"]["status_code"], 400);
  EXPECT_EQ(line["response"]["body"]["error"]["param"], "body.user");
  EXPECT_EQ(line["response"]["body"]["error"]["type"], "invalid_request_error");
  EXPECT_EQ(line["response"]["body"]["error"]["line"], 2);
  fl.max_errors = 1;
  f = read_batch_file(path, "in", JobLimits{}, fl);
  EXPECT_TRUE(f.stopped_early);
  EXPECT_EQ(f.errors.size(), 1u);
}

}  // namespace
}  // namespace moebatch
