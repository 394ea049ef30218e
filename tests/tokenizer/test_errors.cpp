// Bad input never crashes: invalid UTF-8, unknown ids, oversized text and malformed or
// unsupported tokenizer files all give an InputError that names the problem.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

using nlohmann::json;

/// Loads `j` and returns the InputError message ("" when it loaded).
std::string load_error(const json& j, const std::string& config = "") {
  try {
    Tokenizer::from_json(j.dump(), config);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerErrors, InvalidUtf8IsAnInputErrorWithOffset) {
  const Tokenizer& tk = qwen3();
  const std::vector<std::string> bad = {"ok\xFF", "\xC0\xAF", "abc\xED\xA0\x80", "\xF4\x90\x80\x80",
                                        "trunc\xE4\xB8", std::string("nul\0\x80", 5)};
  for (const auto& s : bad) {
    try {
      tk.encode(s);
      ADD_FAILURE() << "accepted invalid UTF-8";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  try {
    tk.encode("abc\xFF");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
  // A NUL byte is valid UTF-8 and is tokenized like any other byte.
  EXPECT_EQ(tk.decode(tk.encode(std::string("a\0b", 3))), std::string("a\0b", 3));
}

TEST(TokenizerErrors, UnknownIdIsAnInputError) {
  const Tokenizer& tk = qwen3();
  const std::vector<TokenId> ids = {9707, 999999};
  EXPECT_THROW(tk.decode(ids), InputError);
  EXPECT_THROW(tk.token_bytes(static_cast<TokenId>(tk.vocab_size())), InputError);
}

TEST(TokenizerErrors, TextOverTheLimitIsRefused) {
  TokenizerLimits limits;
  limits.max_text_bytes = 16;
  const Tokenizer tk = Tokenizer::from_json(tiny_tokenizer_json().dump(), "", limits);
  EXPECT_NO_THROW(tk.encode(std::string(16, 'a')));
  EXPECT_THROW(tk.encode(std::string(17, 'a')), InputError);
}

TEST(TokenizerErrors, MalformedTokenizerJsonNamesTheProblem) {
  EXPECT_EQ(load_error(tiny_tokenizer_json()), "");
  EXPECT_NE(std::string(load_error(json::array())).find("JSON object"), std::string::npos);
  try {
    Tokenizer::from_json("{\"model\": [1, 2", "");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }

  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"no model", [](json& j) { j.erase("model"); }, "model is missing"},
      {"model type", [](json& j) { j["model"]["type"] = "WordPiece"; }, "not supported"},
      {"vocab id type", [](json& j) { j["model"]["vocab"]["ab"] = "x"; }, "must be an integer"},
      {"vocab id range", [](json& j) { j["model"]["vocab"]["ab"] = -1; }, "out of range"},
      {"huge id", [](json& j) { j["model"]["vocab"]["ab"] = 1LL << 40; }, "out of range"},
      {"duplicate id", [](json& j) { j["model"]["vocab"]["abc"] = 256; }, "used twice"},
      {"missing byte", [](json& j) { j["model"]["vocab"].erase("a"); }, "byte-level token"},
      {"merge unknown", [](json& j) { j["model"]["merges"].push_back({"x", "q"}); }, "merges[2]"},
      {"merge shape", [](json& j) { j["model"]["merges"][0] = 5; }, "merges[0]"},
      {"merge string", [](json& j) { j["model"]["merges"][0] = "a b c"; }, "merges[0]"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"normalizer", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "Lowercase"},
      {"pre-tokenizer", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       "Whitespace"},
      {"bad regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}"; },
       "does not compile"},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder type"},
      {"post", [](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; },
       "post_processor"},
      {"added lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"added empty", [](json& j) { j["added_tokens"][0]["content"] = ""; }, "content"},
      {"added id", [](json& j) { j["added_tokens"][0]["id"] = "258"; }, "integer"},
  };
  for (const Case& c : cases) {
    json j = tiny_tokenizer_json();
    c.mutate(j);
    const std::string err = load_error(j);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got '" << err << "'";
    EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << c.what << ": " << err;
  }
}

TEST(TokenizerErrors, ConfigProblemsAreReported) {
  const std::string tj = tiny_tokenizer_json().dump();
  EXPECT_THROW(Tokenizer::from_json(tj, "{\"eos_token\": \"<|nope|>\"}"), InputError);
  EXPECT_THROW(Tokenizer::from_json(tj, "[1"), InputError);
  // A chat template that is not valid Jinja fails the load; one that fails on a conversation
  // fails that rendering only.
  EXPECT_THROW(Tokenizer::from_json(tj, R"({"chat_template": "{{ messages"})"), InputError);
  const Tokenizer tk = Tokenizer::from_json(tj, R"({"chat_template": "{{ messages[0].x.y }}"})");
  try {
    tk.render_chat({{"user", "hi", {}}});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("has no attribute 'x'"), std::string::npos) << e.what();
  }
  const Tokenizer none = Tokenizer::from_json(tj, "");
  EXPECT_THROW(none.render_chat({{"user", "hi", {}}}), InputError);
  // Named templates: an entry whose name is not a string is not "default" (nlohmann's
  // value("name", "") threw type_error out of the load before); the default one is found.
  const Tokenizer named = Tokenizer::from_json(
      tj, R"({"chat_template": [{"name": ["x"], "template": "wrong"}, {"name": "default", "template": "ok"}]})");
  EXPECT_EQ(named.render_chat({{"user", "hi", {}}}), "ok");
  EXPECT_THROW(Tokenizer::from_json(tj, R"({"chat_template": [{"name": 7, "template": "t"}]})"), InputError);
}

TEST(TokenizerErrors, MissingDirectoryAndOversizedFile) {
  EXPECT_THROW(Tokenizer::from_dir("/nonexistent/tokenizer/dir"), InputError);
  TokenizerLimits small;
  small.max_json_bytes = 1024;
  try {
    Tokenizer::from_dir(qwen3_dir(), small);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos);
  }
}

}  // namespace
}  // namespace moebatch::test
