// The OpenAI request parser and response renderers alone: every accepted field lands in the
// job, every refused input names its field, and the chunks have OpenAI's shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "service/batch_create.h"
#include "service/multipart.h"
#include "service/openai_api.h"

namespace moebatch {
namespace {

using nlohmann::json;

std::variant<ApiRequest, ApiError> parse(ApiKind kind, const json& body) {
  return parse_api_request(kind, body.dump(), "demo", JobLimits{});
}

ApiRequest ok(ApiKind kind, const json& body) {
  auto r = parse(kind, body);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body.dump() << " -> " << e->message;
    return {};
  }
  return std::get<ApiRequest>(r);
}

ApiError err(ApiKind kind, const json& body) {
  auto r = parse(kind, body);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << body.dump() << " was accepted";
  return {};
}

json chat(json extra = json::object()) {
  json j = {{"model", "demo"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  j.update(extra);
  return j;
}

TEST(OpenAiParse, ChatFieldsLandInTheJob) {
  const ApiRequest r =
      ok(ApiKind::Chat, chat({{"temperature", 0.5},
                              {"top_p", 0.9},
                              {"top_k", 40},
                              {"seed", -7},
                              {"stop", "END"},
                              {"max_completion_tokens", 12},
                              {"n", 1},
                              {"stream", true},
                              {"stream_options", {{"include_usage", true}}},
                              {"chat_template_kwargs", {{"enable_thinking", false}}},
                              {"user", "u1"},
                              {"presence_penalty", 0}}));
  EXPECT_EQ(r.spec.prompt_kind, PromptKind::Chat);
  EXPECT_EQ(json::parse(r.spec.prompt), json::parse(R"([{"role":"user","content":"Hi"}])"));
  EXPECT_EQ(r.spec.sampling.temperature, 0.5);
  EXPECT_EQ(r.spec.sampling.top_p, 0.9);
  EXPECT_EQ(r.spec.sampling.top_k, 40);
  EXPECT_EQ(r.spec.sampling.seed, -7);
  EXPECT_EQ(r.spec.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.spec.sampling.max_tokens, 12);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.chat_options.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(r.spec.chat_template_kwargs,
            std::optional<std::string>(R"({"enable_thinking":false})"));
  EXPECT_EQ(r.spec.model, std::optional<std::string>("demo"));
  EXPECT_EQ(r.spec.user, std::optional<std::string>("u1"));  // as a batch line keeps it
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "Hi");
}

TEST(OpenAiParse, DefaultsNullsTextPartsAndCompletions) {
  const ApiRequest d = ok(ApiKind::Chat, chat({{"temperature", nullptr}, {"stop", nullptr}}));
  EXPECT_EQ(d.spec.sampling.temperature, 1.0);  // OpenAI's default
  EXPECT_FALSE(d.max_tokens_given);
  EXPECT_FALSE(d.stream);
  const ApiRequest parts = ok(
      ApiKind::Chat,
      {{"model", "demo"},
       {"messages",
        {{{"role", "system"}, {"content", "Be brief."}},
         {{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}});
  EXPECT_EQ(parts.messages[1].content, "a\nb");
  const ApiRequest c = ok(ApiKind::Completion, {{"model", "demo"},
                                                {"prompt", {"Once"}},
                                                {"max_tokens", 3},
                                                {"top_k", -1},
                                                {"stop", {"a", "b"}},
                                                {"echo", false}});
  EXPECT_EQ(c.spec.prompt_kind, PromptKind::Text);
  EXPECT_EQ(c.spec.prompt, "Once");
  EXPECT_EQ(c.spec.sampling.top_k, 0);
  EXPECT_EQ(c.spec.sampling.stop, (std::vector<std::string>{"a", "b"}));
}

TEST(OpenAiParse, BadInputNamesTheField) {
  struct Case {
    ApiKind kind;
    json body;
    int status;
    std::string param;
  };
  const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
  const std::vector<Case> cases = {
      {ApiKind::Chat, chat({{"temperature", "hot"}}), 400, "temperature"},
      {ApiKind::Chat, chat({{"temperature", 2.5}}), 400, "temperature"},
      {ApiKind::Chat, chat({{"top_p", 0}}), 400, "top_p"},
      {ApiKind::Chat, chat({{"n", 2}}), 400, "n"},
      {ApiKind::Chat, chat({{"max_tokens", 0}}), 400, "max_tokens"},
      {ApiKind::Chat, chat({{"max_tokens", 1.5}}), 400, "max_tokens"},
      {ApiKind::Chat, chat({{"seed", 1e30}}), 400, "seed"},
      {ApiKind::Chat, chat({{"stop", {1}}}), 400, "stop"},
      {ApiKind::Chat, chat({{"stop", {"a", "b", "c", "d", "e", "f", "g", "h", "i"}}}), 400, "stop"},
      {ApiKind::Chat, chat({{"frequency_penalty", 0.5}}), 400, "frequency_penalty"},
      {ApiKind::Chat, chat({{"tools", json::array()}}), 400, "tools"},
      {ApiKind::Chat, chat({{"chat_template_kwargs", {{"tools_style", 1}}}}), 400,
       "chat_template_kwargs"},
      {ApiKind::Chat, chat({{"chat_template_kwargs", {{"enable_thinking", "no"}}}}), 400,
       "chat_template_kwargs"},
      {ApiKind::Chat, chat({{"stream_options", {{"include_usage", true}}}}), 400, "stream_options"},
      {ApiKind::Chat, chat({{"model", "gpt-4o"}}), 404, "model"},
      {ApiKind::Chat, {{"model", "demo"}}, 400, "messages"},
      {ApiKind::Chat, {{"messages", msgs}}, 400, "model"},
      {ApiKind::Chat, chat({{"messages", json::array()}}), 400, "messages"},
      {ApiKind::Chat, chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), 400,
       "messages[0].role"},
      {ApiKind::Chat, chat({{"messages", {{{"role", "user"}}}}}), 400, "messages[0].content"},
      {ApiKind::Chat,
       chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}), 400,
       "messages[0].content[0].type"},
      {ApiKind::Chat, chat({{"messages", {{{"role", "user"}, {"content", "x"}, {"tool", 1}}}}}),
       400, "messages[0].tool"},
      {ApiKind::Completion, {{"model", "demo"}, {"prompt", {"a", "b"}}}, 400, "prompt"},
      {ApiKind::Completion, {{"model", "demo"}, {"prompt", {1, 2, 3}}}, 400, "prompt"},
      {ApiKind::Completion, {{"model", "demo"}, {"prompt", ""}}, 400, "prompt"},
      {ApiKind::Completion,
       {{"model", "demo"}, {"prompt", "x"}, {"messages", msgs}},
       400,
       "messages"},
      {ApiKind::Completion, {{"model", "demo"}, {"prompt", "x"}, {"best_of", 2}}, 400, "best_of"},
  };
  for (const Case& c : cases) {
    const ApiError e = err(c.kind, c.body);
    EXPECT_EQ(e.status, c.status) << c.body.dump() << ": " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body.dump() << ": " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
  EXPECT_EQ(parse_api_request(ApiKind::Chat, "{not json", "demo", {}).index(), 1u);
  EXPECT_EQ(parse_api_request(ApiKind::Chat, "[1]", "demo", {}).index(), 1u);
  // Nesting past kMaxJsonDepth (here 100,000 levels, 200 KB, under the body limit) is refused
  // at the parse: copying or printing it would overflow the stack. Duplicate keys too, as on the
  // queue's other doors.
  const std::string deep =
      R"({"model":"demo","messages":[{"role":"user","content":"hi"}],"response_format":{"type":)" +
      std::string(100000, '[') + std::string(100000, ']') + "}}";
  const auto refused = parse_api_request(ApiKind::Chat, deep, "demo", {});
  ASSERT_EQ(refused.index(), 1u);
  EXPECT_EQ(std::get<ApiError>(refused).status, 400);
  EXPECT_NE(std::get<ApiError>(refused).message.find("nested deeper than"), std::string::npos)
      << std::get<ApiError>(refused).message;
  const auto dup = parse_api_request(ApiKind::Completion,
                                     R"({"model":"demo","prompt":"a","prompt":"b"})", "demo", {});
  ASSERT_EQ(dup.index(), 1u);
  EXPECT_NE(std::get<ApiError>(dup).message.find("duplicate key 'prompt'"), std::string::npos)
      << std::get<ApiError>(dup).message;
  // A prompt over the queue's limit is refused with the queue's words.
  JobLimits small;
  small.max_prompt_bytes = 4;
  auto big =
      parse_api_request(ApiKind::Completion, R"({"model":"demo","prompt":"hello"})", "demo", small);
  ASSERT_EQ(big.index(), 1u);
  EXPECT_EQ(std::get<ApiError>(big).param, "prompt");
}

TEST(OpenAiRender, ResponsesAndChunksHaveOpenAisShape) {
  const ApiResponseId chat_id{ApiKind::Chat, "chatcmpl-7", 1700000000, "demo"};
  const json full = json::parse(render_response(chat_id, {"héllo", "stop", 5, 2}));
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "héllo");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(full["usage"]["total_tokens"], 7);

  const std::string first = render_chunk(chat_id, "", true, std::nullopt, false);
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  ASSERT_EQ(first.substr(first.size() - 2), "\n\n");
  const json c1 = json::parse(first.substr(6));
  EXPECT_EQ(c1["object"], "chat.completion.chunk");
  EXPECT_EQ(c1["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(c1["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c1.contains("usage"));
  const json last = json::parse(render_chunk(chat_id, "", false, "length", true).substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_TRUE(last["usage"].is_null());
  const json usage = json::parse(render_usage_chunk(chat_id, 3, 4).substr(6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");

  const ApiResponseId cmpl_id{ApiKind::Completion, "cmpl-8", 1700000000, "demo"};
  const json t = json::parse(render_chunk(cmpl_id, "ab", false, std::nullopt, false).substr(6));
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "ab");
  const json models = json::parse(render_models("demo", 1, 4096));
  EXPECT_EQ(models["data"][0]["id"], "demo");
  EXPECT_EQ(models["data"][0]["max_model_len"], 4096);
  const json e = json::parse(render_error({400, "bad", "n", "", "invalid_request_error"}));
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_TRUE(e["error"]["code"].is_null());
}

TEST(Multipart, PartsWithNamesFilenamesAndBinarySafeBodies) {
  const std::string body =
      "preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch"
      "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.jsonl\"\r\n"
      "Content-Type: application/jsonl\r\n\r\nline1\r\n--Xy\r\nline2\n\r\n--XyZ--\r\n";
  auto r = parse_multipart("multipart/form-data; boundary=XyZ", body);
  ASSERT_EQ(r.index(), 0u) << std::get<std::string>(r);
  const auto& parts = std::get<std::vector<MultipartPart>>(r);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "purpose");
  EXPECT_EQ(parts[0].body, "batch");
  EXPECT_EQ(parts[1].filename, "a b.jsonl");
  EXPECT_EQ(parts[1].content_type, "application/jsonl");
  EXPECT_EQ(parts[1].body, "line1\r\n--Xy\r\nline2\n");
  // Quoted boundary, as some clients send it.
  EXPECT_EQ(parse_multipart("Multipart/Form-Data; boundary=\"XyZ\"", body).index(), 0u);
  for (const auto& [ct, b] : std::vector<std::pair<std::string, std::string>>{
           {"application/json", body},
           {"multipart/form-data", body},
           {"multipart/form-data; boundary=Q", body},
           {"multipart/form-data; boundary=XyZ", "--XyZ\r\nno headers end"},
           {"multipart/form-data; boundary=XyZ", "--XyZ\r\nX: y\r\n\r\nbody --XyZ--"},
           {"multipart/form-data; boundary=XyZ",
            "--XyZ\r\nContent-Disposition: attachment\r\n"
            "\r\nx\r\n--XyZ--"}}) {
    EXPECT_EQ(parse_multipart(ct, b).index(), 1u) << ct << " " << b;
  }
}

// The (name, filename) of each part of a parse that must have succeeded.
using PartNames = std::vector<std::pair<std::string, std::string>>;
PartNames names_of(const std::variant<std::vector<MultipartPart>, std::string>& r) {
  PartNames names;
  if (r.index() != 0) {
    ADD_FAILURE() << std::get<std::string>(r);
    return names;
  }
  for (const MultipartPart& p : std::get<std::vector<MultipartPart>>(r)) names.emplace_back(p.name, p.filename);
  return names;
}

// fuzz_multipart's first finding: parameters were found by searching for ';', so a quoted value
// holding "; name=" or "; filename=" was read as the next parameter (a file named
// "a; name=x.jsonl" given before its name uploaded as a part named 'x.jsonl"', and was refused).
TEST(Multipart, QuotedParametersMayHoldSemicolonsAndKeys) {
  const std::string body =
      "--B\r\nContent-Disposition: form-data; filename=\"a; name=x.jsonl\"; name=\"file\"\r\n"
      "\r\nx\r\n--B\r\nContent-Disposition: form-data; name=\"p; filename=\"; filename=f\r\n"
      "\r\ny\r\n--B--";
  EXPECT_EQ(names_of(parse_multipart("multipart/form-data; x=\"; boundary=A\"; boundary=B ; y", body)),
            (PartNames{{"file", "a; name=x.jsonl"}, {"p; filename=", "f"}}));
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary"), "");
  EXPECT_EQ(multipart_boundary("multipart/form-data;;boundary=\"q;r\""), "q;r");
}

// Quoted values are RFC 9110 quoted-strings: httpx (the OpenAI Python SDK's client) writes a
// filename's backslashes doubled, and a quote inside a value escaped does not end it.
TEST(Multipart, QuotedParametersDecodeBackslashEscapes) {
  const std::string body =
      "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"C:\\\\in\\\\a \\\"b\\\"; name=c.jsonl\"\r\n"
      "\r\nx\r\n--B\r\nContent-Disposition: form-data; name=\"p\\\\\"; filename=\"end\\\\\"\r\n\r\ny\r\n--B--";
  EXPECT_EQ(parse_multipart("multipart/form-data; boundary=\"B\\\"\"; boundary=C", body).index(), 1u)
      << "the first boundary is B\", which no part starts with";
  EXPECT_EQ(names_of(parse_multipart("multipart/form-data; boundary=\"\\B\"", body)),
            (PartNames{{"file", "C:\\in\\a \"b\"; name=c.jsonl"}, {"p\\", "end\\"}}));
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=\"unclosed\\"), "unclosed\\");
}

TEST(BatchCreate, ReadsTheFourFieldsAndNamesWhatItRefuses) {
  const json good = {{"input_file_id", "file-1"},
                     {"endpoint", "/v1/completions"},
                     {"completion_window", "24h"},
                     {"metadata", {{"k", "v"}}}};
  auto r = parse_batch_create(good.dump());
  ASSERT_EQ(r.index(), 0u) << std::get<BatchCreateError>(r).message;
  const BatchRecord& b = std::get<BatchRecord>(r);
  EXPECT_EQ(b.input_file_id, "file-1");
  EXPECT_EQ(b.endpoint, "/v1/completions");
  EXPECT_EQ(b.metadata, R"({"k":"v"})");
  json no_meta = good;
  no_meta["metadata"] = nullptr;
  EXPECT_FALSE(std::get<BatchRecord>(parse_batch_create(no_meta.dump())).metadata);
  auto refused = [](const std::string& body) {
    auto p = parse_batch_create(body);
    return p.index() == 1 ? std::get<BatchCreateError>(p) : BatchCreateError{};
  };
  auto with = [&](const char* key, const json& v) {
    json j = good;
    j[key] = v;
    return refused(j.dump());
  };
  EXPECT_EQ(with("endpoint", "/v1/embeddings").param, "endpoint");
  EXPECT_EQ(with("completion_window", "1h").param, "completion_window");
  EXPECT_EQ(with("metadata", {{"k", 1}}).param, "metadata");
  EXPECT_EQ(with("metadata", {{std::string(65, 'k'), "v"}}).param, "metadata");
  EXPECT_EQ(with("metadata", {{"k", std::string(513, 'v')}}).param, "metadata");
  EXPECT_EQ(with("input_file_id", 5).param, "input_file_id");
  EXPECT_EQ(with("priority", 5).param, "priority");
  const BatchCreateError missing = with("input_file_id", "");
  EXPECT_EQ(missing.param, "input_file_id");
  EXPECT_EQ(missing.code, "missing_required_parameter");
  json many = good;
  for (int i = 0; i < 17; ++i) many["metadata"]["k" + std::to_string(i)] = "v";
  EXPECT_EQ(refused(many.dump()).param, "metadata");
  const BatchCreateError dup = refused(R"({"input_file_id":"a","input_file_id":"b"})");
  EXPECT_EQ(dup.param, "");
  EXPECT_NE(dup.message.find("duplicate key"), std::string::npos) << dup.message;
  EXPECT_EQ(refused("[]").message, "the request body must be a JSON object");
}

}  // namespace
}  // namespace moebatch
