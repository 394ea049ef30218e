// The v1 protocol parser on its own: every rejection names its code and field, and valid
// requests become the JobSpecs the store would accept.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "queue/zmq/ingress.h"
#include "queue/zmq/protocol.h"
#include "tests/common/files.h"

namespace moebatch::zmq_ingress {
namespace {

using nlohmann::json;

ProtocolError parse_error(const std::string& body, json* id = nullptr,
                          const ProtocolLimits& limits = {}) {
  try {
    parse_request(body, limits, id);
  } catch (const ProtocolException& e) {
    return e.error();
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

json submit(json jobs) { return {{"v", 1}, {"cmd", "submit"}, {"id", "r1"}, {"jobs", jobs}}; }

TEST(Protocol, ParsesSubmitWithDefaultsAndBatch) {
  json req = submit(json::array({{{"prompt", "hello"}, {"key", "k1"}},
                                 {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                  {"max_tokens", 7},
                                  {"temperature", 0},
                                  {"stop", "END"},
                                  {"batch_id", "own"}}}));
  req["batch_id"] = "b1";
  Request r = parse_request(req.dump(), {}, nullptr);
  EXPECT_EQ(r.cmd, Command::Submit);
  EXPECT_EQ(r.id, "r1");
  ASSERT_EQ(r.jobs.size(), 2u);
  EXPECT_EQ(r.jobs[0].prompt, "hello");
  EXPECT_EQ(r.jobs[0].client_key, "k1");
  EXPECT_EQ(r.jobs[0].batch_id, "b1");
  EXPECT_EQ(r.jobs[0].sampling.max_tokens, 256);
  EXPECT_EQ(r.jobs[1].prompt_kind, PromptKind::Chat);
  EXPECT_EQ(json::parse(r.jobs[1].prompt)[0]["content"], "hi");
  EXPECT_EQ(r.jobs[1].batch_id, "own");
  EXPECT_EQ(r.jobs[1].sampling.max_tokens, 7);
  EXPECT_EQ(r.jobs[1].sampling.stop, std::vector<std::string>{"END"});
}

TEST(Protocol, SingleJobFormAndJobRefs) {
  Request r = parse_request(R"({"v":1,"cmd":"submit","id":5,"job":{"prompt":"x"}})", {}, nullptr);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.id, 5);
  r = parse_request(R"({"v":1,"cmd":"status","id":1,"job_id":42})", {}, nullptr);
  EXPECT_EQ(r.cmd, Command::Status);
  EXPECT_EQ(r.job_id, 42);
  r = parse_request(R"({"v":1,"cmd":"cancel","id":1,"key":"k"})", {}, nullptr);
  EXPECT_EQ(r.cmd, Command::Cancel);
  EXPECT_EQ(r.client_key, "k");
  r = parse_request(R"({"v":1,"cmd":"result","id":1,"job_id":1})", {}, nullptr);
  EXPECT_EQ(r.cmd, Command::Result);
  EXPECT_EQ(parse_request(R"({"v":1,"cmd":"stats","id":"s"})", {}, nullptr).cmd, Command::Stats);
}

TEST(Protocol, EnvelopeErrorsHaveCodesAndFields) {
  EXPECT_EQ(parse_error("not json").code, "bad_json");
  EXPECT_EQ(parse_error("[1,2]").code, "bad_json");
  EXPECT_EQ(parse_error(std::string(100, '[')).code, "bad_json");
  // Valid JSON nested past the bound, inside an otherwise good request: refused before use.
  const ProtocolError deep = parse_error(R"({"v":1,"cmd":"stats","id":1,"x":)" + std::string(5000, '[') +
                                         std::string(5000, ']') + "}");
  EXPECT_EQ(deep.code, "bad_json");
  EXPECT_NE(deep.message.find("nested deeper than 128 levels"), std::string::npos) << deep.message;
  json id;
  ProtocolError e = parse_error(R"({"v":2,"cmd":"stats","id":"x"})", &id);
  EXPECT_EQ(e.code, "bad_version");
  EXPECT_EQ(e.field, "v");
  EXPECT_EQ(id, "x");  // echoed even though the request failed
  EXPECT_EQ(parse_error(R"({"cmd":"stats","id":1})").code, "bad_version");
  e = parse_error(R"({"v":1,"cmd":"explode","id":1})");
  EXPECT_EQ(e.code, "unknown_command");
  EXPECT_EQ(e.field, "cmd");
  e = parse_error(R"({"v":1,"cmd":"stats"})");
  EXPECT_EQ(e.code, "invalid");
  EXPECT_EQ(e.field, "id");
  EXPECT_EQ(parse_error(R"({"v":1,"cmd":"stats","id":[1]})").field, "id");
  EXPECT_EQ(parse_error(R"({"v":1,"cmd":"stats","id":1,"extra":0})").field, "extra");
  EXPECT_EQ(parse_error(R"({"v":1,"cmd":"status","id":1})").field, "job_id");
  EXPECT_EQ(parse_error(R"({"v":1,"cmd":"status","id":1,"job_id":-3})").field, "job_id");
  EXPECT_EQ(parse_error(R"({"v":1,"cmd":"status","id":1,"job_id":1,"key":"k"})").field, "job_id");
}

TEST(Protocol, JobErrorsNameTheJobAndField) {
  struct Case {
    json job;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "ok"}, {"top_p", 0}}, "jobs[1].top_p"},
      {{{"prompt", "ok"}, {"max_tokens", 1.5}}, "jobs[1].max_tokens"},
      {{{"prompt", "ok"}, {"max_tokens", 18446744073709551615ull}}, "jobs[1].max_tokens"},
      {{{"prompt", "ok"}, {"temperature", "hot"}}, "jobs[1].temperature"},
      {{{"prompt", ""}}, "jobs[1].prompt"},
      {{{"prompt", 3}}, "jobs[1].prompt"},
      {{{"prompt", "a"}, {"messages", json::array()}}, "jobs[1].prompt"},
      {{{"messages", json::array()}}, "jobs[1].messages"},
      {{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "jobs[1].messages[0].role"},
      {{{"prompt", "ok"}, {"key", std::string(300, 'k')}}, "jobs[1].key"},
      {{{"prompt", "ok"}, {"stop", {"a", 1}}}, "jobs[1].stop[1]"},
      {{{"prompt", "ok"}, {"stop", json::array({"1", "2", "3", "4", "5", "6", "7", "8", "9"})}},
       "jobs[1].stop"},
      {{{"prompt", "ok"}, {"colour", "red"}}, "jobs[1].colour"},
      {json::array(), "jobs[1]"},
  };
  for (const Case& c : cases) {
    ProtocolError e = parse_error(submit(json::array({{{"prompt", "fine"}}, c.job})).dump());
    EXPECT_EQ(e.code, "invalid") << c.job.dump();
    EXPECT_EQ(e.field, c.field) << c.job.dump() << " -> " << e.message;
  }
}

TEST(Protocol, LimitsOnSizeAndJobCount) {
  ProtocolLimits limits;
  limits.max_request_bytes = 100;
  limits.max_jobs_per_message = 2;
  EXPECT_EQ(parse_error(std::string(101, ' '), nullptr, limits).code, "too_large");
  json three = submit(json::array({{{"prompt", "a"}}, {{"prompt", "b"}}, {{"prompt", "c"}}}));
  ProtocolError e = parse_error(three.dump(), nullptr, limits);
  EXPECT_EQ(e.code, "too_many_jobs");
  EXPECT_EQ(e.field, "jobs");
  EXPECT_EQ(parse_error(submit(json::array()).dump()).field, "jobs");
}

TEST(Protocol, SpecRoundTripsThroughJson) {
  JobSpec s;
  s.prompt = R"([{"role":"user","content":"hi"}])";
  s.prompt_kind = PromptKind::Chat;
  s.client_key = "k";
  s.batch_id = "b";
  s.priority = 3;
  s.sampling.seed = 9;
  s.sampling.stop = {"x", "y"};
  s.sampling.top_k = 4;
  JobSpec back = job_spec_from_json(job_spec_to_json(s), "job", std::nullopt, JobLimits{});
  EXPECT_EQ(json::parse(back.prompt), json::parse(s.prompt));
  EXPECT_EQ(back.prompt_kind, s.prompt_kind);
  EXPECT_EQ(back.client_key, s.client_key);
  EXPECT_EQ(back.batch_id, s.batch_id);
  EXPECT_EQ(back.priority, 3);
  EXPECT_EQ(back.sampling.seed, 9);
  EXPECT_EQ(back.sampling.stop, s.sampling.stop);
  EXPECT_EQ(back.sampling.top_k, 4);
}

TEST(Protocol, RepliesCarryCodeMessageFieldAndId) {
  json r = json::parse(error_reply("abc", {"invalid", "top_p: bad", "jobs[0].top_p", false}));
  EXPECT_EQ(r["v"], 1);
  EXPECT_EQ(r["id"], "abc");
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"]["code"], "invalid");
  EXPECT_EQ(r["error"]["field"], "jobs[0].top_p");
  EXPECT_EQ(r["error"]["retryable"], false);
  r = json::parse(ok_reply(7, {{"x", 1}}));
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(r["id"], 7);
  EXPECT_EQ(r["x"], 1);
}

}  // namespace
}  // namespace moebatch::zmq_ingress

namespace moebatch::zmq_ingress {
namespace {

nlohmann::json read_schema(const std::string& name) {
  return nlohmann::json::parse(test::read_file(test::source_dir() + "/schemas/" + name));
}

TEST(ProtocolSchemas, RequestExamplesAreAcceptedByTheParser) {
  nlohmann::json schema = read_schema("zmq-request.json");
  ASSERT_GE(schema["examples"].size(), 5u);
  for (const auto& ex : schema["examples"]) {
    EXPECT_NO_THROW(parse_request(ex.dump(), {}, nullptr)) << ex.dump();
  }
}

TEST(ProtocolSchemas, ReplyErrorCodesAndNoticeFieldsMatchTheCode) {
  nlohmann::json reply = read_schema("zmq-reply.json");
  const auto& codes = reply["properties"]["error"]["properties"]["code"]["enum"];
  for (std::string_view c : {error_code::kBadFrames, error_code::kTooLarge, error_code::kBadJson,
                             error_code::kBadVersion, error_code::kUnknownCommand,
                             error_code::kInvalid, error_code::kTooManyJobs, error_code::kNotFound,
                             error_code::kBusy, error_code::kInternal}) {
    EXPECT_NE(std::find(codes.begin(), codes.end(), std::string(c)), codes.end()) << c;
  }
  nlohmann::json notice = read_schema("zmq-notice.json");
  nlohmann::json body = nlohmann::json::parse(
      notice_body({41, "doc-17", std::string("b"), JobState::Done, std::nullopt}));
  for (const auto& key : notice["required"]) EXPECT_TRUE(body.contains(key)) << key;
  EXPECT_EQ(body.size(), notice["required"].size());
}

TEST(Protocol, BatchCommandsNeedABoundedBatchId) {
  for (const char* cmd : {"batch_status", "batch_cancel", "batch_retry", "batch_purge"}) {
    json req = {{"v", 1}, {"cmd", cmd}, {"id", 3}, {"batch_id", "docs-1"}};
    Request r = parse_request(req.dump(), {}, nullptr);
    EXPECT_EQ(r.batch_id, "docs-1") << cmd;
  }
  EXPECT_EQ(parse_request(R"({"v":1,"cmd":"batch_purge","id":1,"batch_id":"b"})", {}, nullptr).cmd,
            Command::BatchPurge);
  ProtocolError e = parse_error(R"({"v":1,"cmd":"batch_status","id":1})");
  EXPECT_EQ(e.code, "invalid");
  EXPECT_EQ(e.field, "batch_id");
  e = parse_error(R"({"v":1,"cmd":"batch_status","id":1,"batch_id":7})");
  EXPECT_EQ(e.field, "batch_id");
  e = parse_error(R"({"v":1,"cmd":"batch_cancel","id":1,"batch_id":""})");
  EXPECT_EQ(e.field, "batch_id");
  e = parse_error(
      json({{"v", 1}, {"cmd", "batch_retry"}, {"id", 1}, {"batch_id", std::string(257, 'b')}})
          .dump());
  EXPECT_EQ(e.field, "batch_id");
  EXPECT_NE(e.message.find("257 bytes exceeds"), std::string::npos) << e.message;
  e = parse_error(R"({"v":1,"cmd":"batch_status","id":1,"batch_id":"b","job_id":3})");
  EXPECT_EQ(e.field, "job_id");
  EXPECT_EQ(e.message, "job_id: unknown field");
}

TEST(Protocol, BatchResultsPagesAreBounded) {
  Request r = parse_request(R"({"v":1,"cmd":"batch_results","id":1,"batch_id":"b"})", {}, nullptr);
  EXPECT_EQ(r.cmd, Command::BatchResults);
  EXPECT_EQ(r.after_id, 0);
  EXPECT_EQ(r.limit, kDefaultResultsPage);
  r = parse_request(
      R"({"v":1,"cmd":"batch_results","id":1,"batch_id":"b","after_id":41,"limit":1000})", {},
      nullptr);
  EXPECT_EQ(r.after_id, 41);
  EXPECT_EQ(r.limit, 1000);
  for (const char* bad : {R"("after_id":-1)", R"("after_id":"7")", R"("after_id":1e3)",
                          R"("after_id":18446744073709551615)"}) {
    ProtocolError e = parse_error(std::string(R"({"v":1,"cmd":"batch_results","id":1,)") +
                                  R"("batch_id":"b",)" + bad + "}");
    EXPECT_EQ(e.field, "after_id") << bad;
  }
  for (const char* bad : {"0", "1001", "-5", "true"}) {
    ProtocolError e = parse_error(
        std::string(R"({"v":1,"cmd":"batch_results","id":1,"batch_id":"b","limit":)") + bad + "}");
    EXPECT_EQ(e.field, "limit") << bad;
  }
  // Paging fields belong to batch_results alone.
  ProtocolError e = parse_error(R"({"v":1,"cmd":"batch_status","id":1,"batch_id":"b","limit":5})");
  EXPECT_EQ(e.field, "limit");
  EXPECT_EQ(e.message, "limit: unknown field");
}

TEST(Protocol, JobsCarryUserMetadataAndTemplateVariables) {
  json job = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
              {"user", "u-1"},
              {"metadata", {{"team", "docs"}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  Request r = parse_request(submit(json::array({job})).dump(), {}, nullptr);
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0].user, "u-1");
  EXPECT_EQ(r.jobs[0].metadata, R"({"team":"docs"})");
  EXPECT_EQ(r.jobs[0].chat_template_kwargs, R"({"enable_thinking":false})");
  // The client's encoding reads back to the same spec.
  json again = job_spec_to_json(r.jobs[0]);
  Request r2 = parse_request(submit(json::array({again})).dump(), {}, nullptr);
  EXPECT_EQ(r2.jobs[0].metadata, r.jobs[0].metadata);
  EXPECT_EQ(r2.jobs[0].user, "u-1");
  job["metadata"] = {{"team", 5}};
  ProtocolError e = parse_error(submit(json::array({job})).dump());
  EXPECT_EQ(e.field, "jobs[0].metadata.team");
  job["metadata"] = "x";
  EXPECT_EQ(parse_error(submit(json::array({job})).dump()).field, "jobs[0].metadata");
}

}  // namespace
}  // namespace moebatch::zmq_ingress
