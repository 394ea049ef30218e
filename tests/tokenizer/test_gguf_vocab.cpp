// The tokenizer a GGUF file carries equals the tokenizer.json path: the vocab-only GGUF of the
// full Qwen3 tokenizer (151936 tokens, 151387 merges, chat template) must reproduce every entry
// of reference.json and the chat renderings; the tiny model's GGUF tokenizer loads and
// round-trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/common/subprocess.h"
#include "tests/tokenizer/fixture.h"

namespace moebatch::test {
namespace {

// tests/data/qwen3-tokenizer/qwen3-vocab.gguf.xz decompressed once into a temp dir.
const Tokenizer& gguf_qwen3() {
  static TempDir dir;
  static const Tokenizer tk = [] {
    const std::string out = dir.file("qwen3-vocab.gguf");
    const RunResult r = run_command({"/bin/sh", "-c", "xz -dc \"$0\" > \"$1\"",
                                     (qwen3_dir() / "qwen3-vocab.gguf.xz").string(), out});
    if (r.exit_code != 0) throw std::runtime_error("xz -dc failed: " + r.err);
    return Tokenizer::from_model(out);
  }();
  return tk;
}

TEST(TokenizerGguf, EveryReferenceEncodingMatches) {
  const Tokenizer& tk = gguf_qwen3();
  const auto ref = nlohmann::json::parse(read_file(qwen3_dir() / "reference.json"));
  for (const auto& e : ref.at("encodings")) {
    const std::string text = e.at("text").get<std::string>();
    const auto want = e.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tk.encode(text), want) << "text: " << text;
    EXPECT_EQ(tk.decode(want), e.at("decoded").get<std::string>()) << "text: " << text;
  }
  for (const auto& c : ref.at("chat")) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c.at("messages"))
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>(), {}});
    ChatOptions opt;
    opt.add_generation_prompt = true;
    opt.enable_thinking = c.at("enable_thinking").get<bool>();
    EXPECT_EQ(tk.render_chat(messages, opt), c.at("text").get<std::string>());
    EXPECT_EQ(tk.encode_chat(messages, opt), c.at("ids").get<std::vector<TokenId>>());
  }
}

TEST(TokenizerGguf, SpecialTokensAndEosAsTheJsonPath) {
  const Tokenizer& tk = gguf_qwen3();
  const Tokenizer& js = qwen3();
  EXPECT_EQ(tk.eos_ids().front(), 151645u);
  for (TokenId id : {151643u, 151644u, 151645u, 151667u, 151668u}) {
    EXPECT_EQ(tk.is_special(id), js.is_special(id)) << id;
    EXPECT_EQ(tk.token_bytes(id), js.token_bytes(id)) << id;
  }
}

TEST(TokenizerGguf, TinyModelFileCarriesItsTokenizer) {
  const Tokenizer tk =
      Tokenizer::from_model(test_data_dir() + "/qwen3moe_tiny_q4km/qwen3moe_tiny_q4km.gguf");
  EXPECT_EQ(tk.vocab_size(), 1024u);
  const std::string text = "in the beginning";
  EXPECT_EQ(tk.decode(tk.encode(text)), text);
  EXPECT_EQ(tk.eos_ids().front(), 1023u);
}

}  // namespace
}  // namespace moebatch::test
