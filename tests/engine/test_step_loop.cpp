// The engine's step loop through the factory: schedule → forward-and-sample → postprocess.
// Stop strings end a sequence at the step that completes them; abort() frees a slot and its
// KV blocks at once, for running and waiting requests; the factory's facts match the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/error.h"
#include "engine/factory.h"
#include "tests/common/prompts.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

using test::random_prompt;

BuiltEngine build(int64_t slots, int tp = 1) {
  return make_engine(
      fixture_spec("qwen3_moe_tiny", tp, {.max_num_seqs = slots, .max_num_batched_tokens = 64}));
}

Request greedy(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens) {
  return greedy_request(id, std::move(prompt), max_tokens);
}

// Stops once it has seen `count` tokens equal to `token`: a stand-in for a text match that
// completes at a known step (the detokenizing watcher is tested with the tokenizer and through
// the service).
class StopAfter final : public StopStrings {
 public:
  StopAfter(int32_t token, int count) : token_(token), left_(count) {}
  bool push(int32_t t) override {
    ++pushed;
    return t == token_ && --left_ == 0;
  }
  int pushed = 0;

 private:
  int32_t token_;
  int left_;
};

TEST(StepLoop, StopStringEndsAtTheStepThatCompletesIt) {
  std::mt19937 rng(std::random_device{}());
  auto e = build(2);
  const int64_t V = e.engine->config().vocab_size;
  const auto prompt = random_prompt(rng, 9, V);
  e.engine->add(greedy(0, prompt, 12));
  const auto free_run = run_to_completion(*e.engine);
  ASSERT_EQ(free_run.size(), 1u);
  ASSERT_EQ(free_run[0].tokens.size(), 12u);
  // Stop on the 5th generated token's id: the sequence ends at its first occurrence.
  const int32_t tok = free_run[0].tokens[4];
  const size_t first = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), tok) -
                       free_run[0].tokens.begin();
  auto watcher = std::make_shared<StopAfter>(tok, 1);
  Request r = greedy(1, prompt, 12);
  r.stop_strings = watcher;
  e.engine->add(r);
  const auto stopped = run_to_completion(*e.engine);
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].reason, FinishReason::StopString);
  EXPECT_EQ(stopped[0].tokens.size(), first + 1) << "generation ends at the matching step";
  EXPECT_EQ(watcher->pushed, static_cast<int>(first + 1)) << "every generated token, once";
  EXPECT_TRUE(
      std::equal(stopped[0].tokens.begin(), stopped[0].tokens.end(), free_run[0].tokens.begin()));
}

TEST(StepLoop, StopTokenIsCheckedBeforeStopStrings) {
  std::mt19937 rng(std::random_device{}());
  auto e = build(1);
  const auto prompt = random_prompt(rng, 6, e.engine->config().vocab_size);
  e.engine->add(greedy(0, prompt, 6));
  const auto free_run = run_to_completion(*e.engine);
  const int32_t tok = free_run[0].tokens[2];
  Request r = greedy(1, prompt, 6);
  r.sampling.stop_token_ids = {tok};
  r.stop_strings = std::make_shared<StopAfter>(tok, 1);
  e.engine->add(r);
  const auto out = run_to_completion(*e.engine);
  EXPECT_EQ(out[0].reason, FinishReason::StopToken);
  EXPECT_EQ(out[0].tokens.back(), tok);
}

TEST(StepLoop, AbortFreesTheSlotForTheNextRequestAtOnce) {
  std::mt19937 rng(std::random_device{}());
  auto e = build(1);  // one slot: the second request runs only once the first is gone
  Engine& eng = *e.engine;
  const int64_t V = eng.config().vocab_size;
  const int64_t blocks = e.info.backend.kv_blocks;
  eng.add(greedy(7, random_prompt(rng, 10, V), 400));
  eng.add(greedy(8, random_prompt(rng, 5, V), 3));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(eng.step().empty());
  EXPECT_EQ(eng.num_running(), 1u);
  EXPECT_TRUE(eng.abort(7));
  EXPECT_FALSE(eng.abort(7)) << "already gone";
  EXPECT_EQ(eng.num_running(), 0u) << "slot freed before the next step";
  std::vector<FinishedSequence> all;
  for (int i = 0; i < 20 && !eng.idle(); ++i)
    for (auto& f : eng.step()) all.push_back(std::move(f));
  ASSERT_EQ(all.size(), 1u) << "the aborted request is never returned";
  EXPECT_EQ(all[0].id, 8u);
  EXPECT_EQ(all[0].tokens.size(), 3u);
  // Every block is back: a request needing the whole cache is admitted.
  const int64_t whole = blocks * e.info.backend.block_size;
  const int64_t len = std::min<int64_t>(whole, e.info.max_context) - 1;
  eng.add(greedy(9, random_prompt(rng, static_cast<size_t>(len), V), 1));
  EXPECT_EQ(run_to_completion(eng).size(), 1u);
}

TEST(StepLoop, AbortOfAWaitingRequest) {
  std::mt19937 rng(std::random_device{}());
  auto e = build(1);
  const int64_t V = e.engine->config().vocab_size;
  e.engine->add(greedy(1, random_prompt(rng, 4, V), 2));
  e.engine->add(greedy(2, random_prompt(rng, 4, V), 2));
  EXPECT_TRUE(e.engine->abort(2));
  const auto out = run_to_completion(*e.engine);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, 1u);
}

TEST(Factory, FactsMatchTheEngineAndBadSpecsFailClearly) {
  auto e = build(4, 2);
  EXPECT_EQ(e.info.vocab_size, e.engine->config().vocab_size);
  EXPECT_EQ(e.info.slots, 4);
  ASSERT_EQ(e.info.backend.devices.size(), 2u) << "one entry per rank";
  for (const DeviceUsage& d : e.info.backend.devices) {
    EXPECT_EQ(d.device, "cpu");
    EXPECT_GT(d.weight_bytes, 0);
    EXPECT_GT(d.kv_bytes, 0);
  }
  EXPECT_GT(e.info.backend.kv_blocks, 0);
  EXPECT_EQ(e.info.backend.kv_bytes_per_token,
            e.info.backend.devices[0].kv_bytes * 2 / e.info.backend.kv_tokens());
  EXPECT_NE(e.info.describe().find("qwen3_moe"), std::string::npos) << e.info.describe();

  EngineSpec bad = fixture_spec("qwen3_moe_tiny");
  bad.backend = "tpu";
  EXPECT_THROW(make_engine(bad), InputError);
  bad.backend = "cpu";
  bad.model = "random:qwen3-30b-a3b";
  EXPECT_THROW(make_engine(bad), InputError) << "random weights are a CUDA feature";
  bad.model = "";
  EXPECT_THROW(make_engine(bad), InputError);
  bad = fixture_spec("qwen3_moe_tiny");
  bad.tensor_parallel_size = 0;
  EXPECT_THROW(make_engine(bad), InputError);
}

}  // namespace
}  // namespace moebatch
