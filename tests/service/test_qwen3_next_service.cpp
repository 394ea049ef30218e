// The hybrid Qwen3-Next demo model (Gated DeltaNet + gated full attention, random weights, the
// bundled Qwen3 tokenizer) through the whole stack: the generated checkpoint has the hybrid
// layout and is the same bytes for the same seed; the engine loads it and generates text; the
// real `moebatch serve` drains a mixed queue (plain SQL and `moebatch submit`, text and chat,
// greedy and seeded sampling, more jobs than slots so recurrent-state slots are reused) with every
// job done, and equal requests give equal text whichever slot and batch they ran in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/factory.h"
#include "engine/model_config.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::filesystem::path tokenizer_dir() {
  return std::filesystem::path(test::test_data_dir()) / "qwen3-tokenizer";
}

std::filesystem::path next_model(const std::filesystem::path& cache = MOEBATCH_TEST_CACHE) {
  return ensure_demo_model(cache, tokenizer_dir(), {.arch = DemoArch::Qwen3Next});
}

TEST(Qwen3NextDemoModel, HybridLayoutAndDeterministicBytes) {
  const auto model = next_model();
  const auto moe = test::demo_model();
  EXPECT_NE(model, moe);
  EXPECT_NE(model.filename().string().find("qwen3next"), std::string::npos) << model;
  EXPECT_NE(moe.filename().string().find("qwen3moe"), std::string::npos) << moe;

  const ModelConfig c = load_model_config(model);
  EXPECT_EQ(c.arch, ModelArch::Qwen3Next);
  EXPECT_EQ(c.vocab_size, load_model_config(moe).vocab_size);  // the tokenizer's
  ASSERT_EQ(c.num_layers, 4);
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(c.layers[l].mixer, l == 3 ? MixerKind::FullAttention : MixerKind::LinearAttention);
    EXPECT_EQ(c.layers[l].mlp, MlpKind::MoeShared);
  }
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rotary_dim, c.head_dim / 4);
  EXPECT_EQ(c.linear.k_head_dim, 32);
  EXPECT_EQ(c.linear.v_head_dim, 32);
  EXPECT_EQ(c.linear.num_k_heads, 2);
  EXPECT_EQ(c.linear.num_v_heads, 4);
  EXPECT_EQ(c.linear.conv_kernel, 4);
  EXPECT_GT(c.shared_expert_intermediate_size, 0);

  // The same spec generated into another cache: the same bytes.
  test::TempDir other;
  const auto again = next_model(other.path());
  EXPECT_EQ(again.filename(), model.filename());
  EXPECT_EQ(test::read_file(again / "config.json"), test::read_file(model / "config.json"));
  EXPECT_TRUE(test::read_file(again / "model.safetensors") ==
              test::read_file(model / "model.safetensors"));
  // The environment switch of `moebatch demo` and the end-to-end scripts.
  setenv("MOEBATCH_DEMO_ARCH", "qwen3_next", 1);
  EXPECT_EQ(demo_model_spec_from_env().arch, DemoArch::Qwen3Next);
  setenv("MOEBATCH_DEMO_ARCH", "mamba", 1);
  EXPECT_THROW(demo_model_spec_from_env(), InputError);
  unsetenv("MOEBATCH_DEMO_ARCH");
  EXPECT_EQ(demo_model_spec_from_env().arch, DemoArch::Qwen3Moe);
}

TEST(Qwen3NextDemoModel, EngineLoadsItAndGeneratesText) {
  const auto model = next_model();
  EngineSpec spec;
  spec.model = model.string();
  spec.scheduler = {.max_num_seqs = 2, .max_num_batched_tokens = 256};
  spec.threads = 2;
  spec.kv_cache_bytes = 16 << 20;
  BuiltEngine built = make_engine(spec);
  EXPECT_NE(built.info.model.find("qwen3_next"), std::string::npos) << built.info.model;
  const Tokenizer tok = Tokenizer::from_dir(model);
  const auto ids = tok.encode("The hybrid model reads this prompt and answers:");
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  Request greedy;
  greedy.id = 1;
  greedy.prompt = prompt;
  greedy.keep_logits = true;
  greedy.sampling.temperature = 0;
  greedy.sampling.max_tokens = 12;
  Request sampled;
  sampled.id = 2;
  sampled.prompt = prompt;
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 20;
  sampled.sampling.seed = 7;
  sampled.sampling.max_tokens = 12;
  built.engine->add(greedy);
  built.engine->add(sampled);
  const auto fin = run_to_completion(*built.engine);
  ASSERT_EQ(fin.size(), 2u);
  const int64_t V = built.info.vocab_size;
  for (const FinishedSequence& f : fin) {
    ASSERT_EQ(f.tokens.size(), 12u) << "request " << f.id;
    const std::vector<TokenId> out(f.tokens.begin(), f.tokens.end());
    const std::string text = tok.decode(out);
    EXPECT_FALSE(text.empty()) << "request " << f.id;
    if (f.id != 1) continue;
    ASSERT_EQ(f.logits.size(), 12u * static_cast<size_t>(V));
    for (size_t s = 0; s < 12; ++s) {
      const float* row = f.logits.data() + s * V;
      float lo = row[0], hi = row[0];
      for (int64_t i = 0; i < V; ++i) {
        ASSERT_TRUE(std::isfinite(row[i])) << "step " << s << " id " << i;
        lo = std::min(lo, row[i]);
        hi = std::max(hi, row[i]);
      }
      EXPECT_GT(hi - lo, 1.0f) << "flat logits at step " << s;
    }
  }
}

// One job of the mixed queue.
struct JobRow {
  std::string key, kind, prompt;  // kind: text | chat; prompt: the text or the user message
  int64_t max_tokens = 0;
  double temperature = 0;
  int64_t seed = 0;
};

JobRow mixed_job(int i) {
  static const char* const kTopics[] = {"recurrent state", "gated attention", "expert routing",
                                        "job queues",      "slot reuse",      "partial rotary"};
  JobRow j;
  j.key = "sql-" + std::to_string(i);
  j.kind = i % 3 == 1 ? "chat" : "text";
  j.prompt = j.kind == "chat"
                 ? "Question " + std::to_string(i) + ": what is " + kTopics[i % 6] + "?"
                 : "Job " + std::to_string(i) + ": two sentences on " + kTopics[i % 6];
  j.max_tokens = 4 + (i * 7) % 29;  // 4..32: several decode steps, finishing at different times
  j.temperature = i % 2 == 0 ? 0.0 : 0.8;
  j.seed = 1000 + i;
  return j;
}

std::string insert_sql(const JobRow& j) {
  const std::string prompt =
      j.kind == "chat" ? json::array({{{"role", "user"}, {"content", j.prompt}}}).dump() : j.prompt;
  char* q = sqlite3_mprintf(
      "INSERT INTO jobs (client_key, batch_id, prompt_kind, prompt, max_tokens, temperature, "
      "top_p, top_k, seed) VALUES (%Q, 'qwen3-next', %Q, %Q, %lld, %f, 0.9, 20, %lld);",
      j.key.c_str(), j.kind.c_str(), prompt.c_str(), static_cast<long long>(j.max_tokens),
      j.temperature, static_cast<long long>(j.seed));
  std::string sql = q;
  sqlite3_free(q);
  return sql;
}

std::vector<std::string> submit_args(const std::filesystem::path& db, const JobRow& j,
                                     const std::string& key) {
  std::vector<std::string> a = {"submit",        "--db",
                                db.string(),     j.prompt,
                                "--key",         key,
                                "--max-tokens",  std::to_string(j.max_tokens),
                                "--temperature", std::to_string(j.temperature),
                                "--top-p",       "0.9",
                                "--top-k",       "20",
                                "--seed",        std::to_string(j.seed)};
  if (j.kind == "chat") a.push_back("--chat");
  return a;
}

// `moebatch serve` on the Qwen3-Next demo model with 4 slots drains 40 jobs: 36 inserted by plain
// SQL while it runs (the last 4 repeat the first 4), then 4 through `moebatch submit` that
// repeat SQL jobs (text and chat, greedy and sampled). Twins run in different batches and, with
// 4 slots for 40 jobs, in recurrent-state slots other sequences used before; they must give the
// same text.
TEST(Qwen3NextService, ServeDrainsMixedJobsAndTwinsGiveTheSameText) {
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db", ready = dir.path() / "ready.json";
  test::Child serve(
      test::join_args({{test::moebatch_bin(), "serve", "--db", db.string(), "--model",
                        next_model().string(), "--tokenizer", tokenizer_dir().string(),
                        "--served-model-name", "demo", "--bind", "tcp://127.0.0.1:*", "--http-port",
                        "0", "--ready-file", ready.string(), "--poll-ms", "10"},
                       test::small_engine_flags(4)}),
      dir.path() / "serve.log");
  ASSERT_TRUE(test::wait_ready(ready, 60s)) << serve.read_log();

  std::string sql = "BEGIN IMMEDIATE;";
  for (int i = 0; i < 32; ++i) sql += insert_sql(mixed_job(i));
  for (int i = 0; i < 4; ++i) {
    JobRow twin = mixed_job(i);
    twin.key = "sql-twin-" + std::to_string(i);
    sql += insert_sql(twin);
  }
  ASSERT_EQ(test::exec_sql(db, sql + "COMMIT;"), "");
  const int cli_twins[] = {0, 1, 2, 4};  // text greedy, chat sampled, text greedy, chat greedy
  for (int i : cli_twins) {
    const auto r = test::run_cli(submit_args(db, mixed_job(i), "cli-twin-" + std::to_string(i)));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  const auto count = [&](const std::string& where) {
    return test::query_i64(db, "SELECT count(*) FROM jobs WHERE " + where);
  };
  ASSERT_TRUE(test::wait_until([&] { return count("state IN ('done', 'failed')") == 40; }, 60s))
      << count("state = 'done'") << " done\n"
      << serve.read_log();
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_for(30s), 0) << serve.read_log();

  EXPECT_EQ(count("1"), 40);
  EXPECT_EQ(count("state = 'done' AND result_text IS NOT NULL"), 40)
      << test::query_text(db, "SELECT error FROM jobs WHERE state = 'failed'");
  EXPECT_EQ(count("completion_tokens BETWEEN 1 AND max_tokens"), 40);
  EXPECT_EQ(count("prompt_kind = 'chat'"), 14);
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM job_latency"), 40);
  EXPECT_GT(test::query_i64(db, "SELECT max(completion_tokens) FROM jobs"), 16);
  // Random weights, but not a degenerate model: the texts differ from job to job.
  EXPECT_GT(test::query_i64(db, "SELECT count(DISTINCT result_text) FROM jobs"), 20);
  EXPECT_NE(serve.read_log().find("qwen3_next"), std::string::npos) << serve.read_log();

  const auto result = [&](const std::string& key) {
    return test::query_text(
        db, "SELECT completion_tokens || ':' || result_text FROM jobs WHERE client_key = '" + key +
                "'");
  };
  for (int i = 0; i < 4; ++i) {
    const std::string first = result("sql-" + std::to_string(i));
    ASSERT_FALSE(first.empty()) << "sql-" << i;
    EXPECT_EQ(result("sql-twin-" + std::to_string(i)), first) << "SQL twin of job " << i;
  }
  for (int i : cli_twins)
    EXPECT_EQ(result("cli-twin-" + std::to_string(i)), result("sql-" + std::to_string(i)))
        << "CLI twin of job " << i;
}

}  // namespace
}  // namespace moebatch
