// Qwen3-Next on the CPU backend beyond the oracle comparison of test_reference.cpp: the config
// (hybrid layer layout, partial rotary, field errors), the recurrent state (decode with state vs
// full recompute, chunked vs one-shot prefill, batch neighbours and slot reuse, the backend's
// checks on state slots) and tensor parallelism of the Gated DeltaNet layers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/ops.h"
#include "tests/common/files.h"
#include "tests/common/prompts.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

using nlohmann::json;
using test::random_prompt;

constexpr const char* kModel = "qwen3_next_tiny";

std::mt19937 fresh_rng() { return std::mt19937(std::random_device{}()); }

json fixture_config() {
  std::ifstream in(test_data_dir() + "/" + kModel + "/config.json");
  return json::parse(in);
}

std::vector<MixerKind> mixers(const ModelConfig& c) {
  std::vector<MixerKind> out;
  for (const LayerKind& k : c.layers) out.push_back(k.mixer);
  return out;
}

constexpr MixerKind kLin = MixerKind::LinearAttention, kFull = MixerKind::FullAttention;

TEST(Qwen3NextConfig, HybridLayoutAndStateSize) {
  const ModelConfig c = load_model_config(test_data_dir() + "/" + kModel);
  EXPECT_EQ(c.arch, ModelArch::Qwen3Next);
  EXPECT_EQ(mixers(c), (std::vector<MixerKind>{kLin, kLin, kLin, kFull}));
  for (const LayerKind& k : c.layers) EXPECT_EQ(k.mlp, MlpKind::MoeShared);
  EXPECT_EQ(c.num_kv_layers(), 1);
  EXPECT_EQ(c.rotary_dim, 16);  // 64 · 0.25
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norm);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.linear.conv_dim(), 2 * 4 * 32 + 8 * 32);
  // 3 linear layers × (conv [512, 3] + delta rule [8, 32, 32]) fp32
  EXPECT_EQ(c.state_bytes_per_seq(), 3 * (512 * 3 + 8 * 32 * 32) * 4);

  // Without layer_types, every full_attention_interval-th layer is full attention (default 4).
  json j = fixture_config();
  j.erase("layer_types");
  EXPECT_EQ(mixers(parse_model_config(j, "c")), (std::vector<MixerKind>{kLin, kLin, kLin, kFull}));
  j["full_attention_interval"] = 2;
  EXPECT_EQ(mixers(parse_model_config(j, "c")), (std::vector<MixerKind>{kLin, kFull, kLin, kFull}));
  // Hub spelling: top-level partial_rotary_factor and rope_theta, no rope_parameters.
  j = fixture_config();
  j.erase("rope_parameters");
  j["rope_theta"] = 1e6;
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse_model_config(j, "c").rotary_dim, 32);
}

TEST(Qwen3NextConfig, UnsupportedValuesNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"layer_types", json{"linear_attention", "mamba", "linear_attention", "full_attention"},
       "layer_types"},
      {"layer_types", json{"linear_attention", "full_attention"}, "layer_types"},
      {"linear_num_value_heads", 6, "linear_num_value_heads"},
      {"linear_conv_kernel_dim", 0, "linear_conv_kernel_dim"},
      {"attention_bias", true, "attention_bias"},
      {"full_attention_interval", 0, "full_attention_interval"},
  };
  for (const auto& c : cases) {
    json j = fixture_config();
    if (std::string(c.field) == "full_attention_interval") j.erase("layer_types");
    j[c.field] = c.value;
    const std::string err = config_error(j);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.field << " -> '" << err << "'";
  }
  json j = fixture_config();
  j["partial_rotary_factor"] = 0.5;  // disagrees with rope_parameters' 0.25
  EXPECT_NE(config_error(j).find("partial_rotary_factor"), std::string::npos) << config_error(j);
  j = fixture_config();
  j["rope_parameters"]["partial_rotary_factor"] = 0.03;  // 64 · 0.03 → 1 rotary dim
  EXPECT_NE(config_error(j).find("partial_rotary_factor"), std::string::npos) << config_error(j);
  // Other families have no partial rotary: refused rather than silently rotating every dim.
  j = fixture_config();
  j.erase("architectures");
  j["model_type"] = "qwen3_moe";
  j.erase("layer_types");
  EXPECT_NE(config_error(j).find("partial_rotary_factor"), std::string::npos) << config_error(j);
}

TEST(Qwen3NextConfig, TensorParallelNeedsWholeKeyHeadGroups) {
  json j = fixture_config();
  j["linear_num_key_heads"] = 2;  // 8 value heads in 2 groups of 4
  const ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(shard_dims(c, {1, 2}).lin_k_head0, 1);
  EXPECT_EQ(shard_dims(c, {1, 2}).lin_v_heads, 4);
  try {
    shard_dims(c, {0, 4});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("linear_num_key_heads"), std::string::npos) << e.what();
  }
}

TEST(Qwen3NextOps, PartialRopeRotatesOnlyTheLeadingDims) {
  auto rng = fresh_rng();
  std::normal_distribution<float> nd;
  const int64_t hd = 32, rot = 8, heads = 2;
  std::vector<float> x(heads * hd);
  for (auto& v : x) v = nd(rng);
  const auto orig = x;
  const auto pos = static_cast<int32_t>(rng() % 1000);
  cpu::rope_neox(x.data(), &pos, 1, heads, hd, rot, 1e6);
  for (int64_t h = 0; h < heads; ++h) {
    const float* o = orig.data() + h * hd;
    const float* y = x.data() + h * hd;
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double a = pos * std::pow(1e6, -2.0 * i / rot);
      EXPECT_NEAR(y[i], o[i] * std::cos(a) - o[i + rot / 2] * std::sin(a), 1e-5);
      EXPECT_NEAR(y[i + rot / 2], o[i + rot / 2] * std::cos(a) + o[i] * std::sin(a), 1e-5);
    }
    for (int64_t i = rot; i < hd; ++i) EXPECT_EQ(y[i], o[i]);
  }
}

// Greedy generation keeping every step's logits.
Request logged(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens) {
  return greedy_request(id, std::move(prompt), max_tokens, /*keep_logits=*/true);
}

// Decoding from the recurrent state equals recomputing the whole sequence at every step.
TEST(Qwen3NextEngine, DecodeWithStateEqualsFullRecompute) {
  auto rng = fresh_rng();
  auto eng = make_engine(kModel);
  const int64_t V = eng->config().vocab_size;
  const auto prompt = random_prompt(rng, 5 + rng() % 20, V);
  eng->add(logged(1, prompt, 12));
  auto fin = run_to_completion(*eng);
  ASSERT_EQ(fin.size(), 1u);
  ASSERT_EQ(fin[0].tokens.size(), 12u);
  auto seq = prompt;
  seq.insert(seq.end(), fin[0].tokens.begin(), fin[0].tokens.end() - 1);
  const auto full = eng->score(seq);
  for (size_t s = 0; s < 12; ++s) {
    const float* rec = full.data() + (prompt.size() - 1 + s) * V;
    EXPECT_LT(rel_err(fin[0].logits.data() + s * V, rec, V), 1e-5) << "step " << s;
  }
}

// A prompt prefilled in chunks of 7 tokens (the state carried between steps) gives bitwise the
// one-shot prefill's tokens and logits.
TEST(Qwen3NextEngine, ChunkedPrefillEqualsOneShot) {
  auto rng = fresh_rng();
  const auto prompt = random_prompt(rng, 30 + rng() % 30, 1024);
  auto one_shot = make_engine(kModel, 1, {.max_num_seqs = 1, .max_num_batched_tokens = 512});
  auto chunked = make_engine(kModel, 1, {.max_num_seqs = 1, .max_num_batched_tokens = 7});
  one_shot->add(logged(0, prompt, 6));
  chunked->add(logged(0, prompt, 6));
  const auto a = run_to_completion(*one_shot), b = run_to_completion(*chunked);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_EQ(a[0].logits, b[0].logits);
}

// A sequence gives bitwise the same tokens and logits alone, among neighbours in mixed prefill +
// decode steps, in a slot another sequence used before (its state reset), and again after every
// slot has been used.
TEST(Qwen3NextEngine, BatchNeighboursAndSlotReuseChangeNothing) {
  auto rng = fresh_rng();
  auto alone = make_engine(kModel);
  const auto prompt = random_prompt(rng, 20 + rng() % 30, 1024);
  Request a = logged(0, prompt, 10);
  a.sampling.temperature = 0.8f;
  a.sampling.seed = rng();
  alone->add(a);
  const auto ref = run_to_completion(*alone);
  ASSERT_EQ(ref.size(), 1u);

  auto busy = make_engine(kModel, 1, {.max_num_seqs = 3, .max_num_batched_tokens = 24});
  auto other = [&](uint64_t id) {
    Request o = logged(id, random_prompt(rng, 3 + rng() % 40, 1024), 2 + rng() % 12);
    o.sampling.temperature = 1.0f;
    o.sampling.seed = rng();
    return o;
  };
  // 1..3 fill the three slots; `a` waits and takes the first slot one of them frees.
  for (uint64_t id = 1; id <= 3; ++id) busy->add(other(id));
  busy->add(a);
  for (uint64_t id = 4; id <= 6; ++id) busy->add(other(id));
  auto all = run_to_completion(*busy);
  ASSERT_EQ(all.size(), 7u);
  busy->add(a);  // every slot has held state by now
  auto again = run_to_completion(*busy);
  all.insert(all.end(), again.begin(), again.end());
  int seen = 0;
  for (const auto& f : all) {
    if (f.id != 0) continue;
    ++seen;
    EXPECT_EQ(f.tokens, ref[0].tokens);
    EXPECT_EQ(f.logits, ref[0].logits);
  }
  EXPECT_EQ(seen, 2);
}

TEST(Qwen3NextEngine, TensorParallelGenerationMatches) {
  auto rng = fresh_rng();
  const auto prompt = random_prompt(rng, 16, 1024);
  std::vector<std::vector<float>> logits;
  for (int tp : {1, 2, 4}) {
    auto eng = make_engine(kModel, tp, {.max_num_seqs = 2, .max_num_batched_tokens = 8});
    eng->add(logged(0, prompt, 6));
    logits.push_back(run_to_completion(*eng)[0].logits);
  }
  for (size_t i = 1; i < logits.size(); ++i)
    for (size_t s = 0; s < 6; ++s)
      EXPECT_LT(rel_err(logits[i].data() + s * 1024, logits[0].data() + s * 1024, 1024), 1e-5)
          << "tp " << (1 << i) << " step " << s;
}

// A model of only Gated DeltaNet layers (the fixture's first three) keeps no KV at all: it
// still serves, and decoding from its state still equals recomputing.
TEST(Qwen3NextEngine, ModelWithoutFullAttentionLayers) {
  test::TempDir tmp;
  json j = fixture_config();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"linear_attention", "linear_attention", "linear_attention"};
  std::ofstream(tmp.path() / "config.json") << j.dump();
  std::filesystem::copy_file(test_data_dir() + "/" + kModel + "/model.safetensors",
                             tmp.path() / "model.safetensors");
  EngineSpec spec = fixture_spec(kModel);
  spec.model = tmp.path().string();
  auto eng = moebatch::make_engine(spec).engine;
  EXPECT_EQ(eng->config().num_kv_layers(), 0);
  EXPECT_EQ(eng->backend_info().kv_bytes_per_token, 0);
  auto rng = fresh_rng();
  const auto prompt = random_prompt(rng, 9, 1024);
  eng->add(logged(0, prompt, 5));
  const auto fin = run_to_completion(*eng);
  ASSERT_EQ(fin.size(), 1u);
  auto seq = prompt;
  seq.insert(seq.end(), fin[0].tokens.begin(), fin[0].tokens.end() - 1);
  const auto full = eng->score(seq);
  for (size_t s = 0; s < 5; ++s)
    EXPECT_LT(rel_err(fin[0].logits.data() + s * 1024, full.data() + (8 + s) * 1024, 1024), 1e-5);
}

// One sequence row of `n` tokens at positions p0.. in state slot `slot`, KV blocks 0.. .
StepBatch row_batch(int32_t slot, int32_t p0, int32_t n) {
  StepBatch b;
  b.max_blocks_per_seq = 8;
  b.block_tables = {0, 1, 2, 3, 4, 5, 6, 7};
  b.state_slots = {slot};
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(7 + p0 + i);  // token ids follow the position
    b.positions.push_back(p0 + i);
    b.seq_index.push_back(0);
    b.slot_mapping.push_back(p0 + i);
  }
  b.logits_rows = {n - 1};
  return b;
}

TEST(Qwen3NextBackend, StateSlotsAreSizedAndChecked) {
  CpuBackendOptions o;
  o.threads = 2;
  o.state_slots = 3;
  o.kv_cache_bytes = 4 << 20;
  CpuBackend be(fixture_path(kModel), o);
  EXPECT_EQ(be.info().state_slots, 3);
  EXPECT_EQ(be.info().devices[0].state_bytes, 3 * be.config().state_bytes_per_seq());
  std::vector<float> logits, split;

  // Chunks continue the slot's state: [0, 10) + [10, 20) ends where [0, 20) does.
  be.forward(row_batch(1, 0, 20), logits);
  be.forward(row_batch(1, 0, 10), split);
  be.forward(row_batch(1, 10, 10), split);
  EXPECT_EQ(split, logits);

  // A row that does not continue where its slot ended would read another sequence's state.
  EXPECT_THROW(be.forward(row_batch(2, 5, 1), logits), Error);   // fresh slot, position 5
  EXPECT_THROW(be.forward(row_batch(1, 21, 1), logits), Error);  // slot 1 ended at 20
  EXPECT_THROW(be.forward(row_batch(3, 0, 1), logits), Error);   // only slots 0..2
  StepBatch gap = row_batch(0, 0, 4);
  gap.positions[2] = 3;
  gap.slot_mapping[2] = 3;
  EXPECT_THROW(be.forward(gap, logits), Error);
  StepBatch none = row_batch(0, 0, 4);
  none.state_slots.clear();
  EXPECT_THROW(be.forward(none, logits), Error);
  // Two rows of one step in one slot.
  StepBatch two = row_batch(0, 0, 2);
  two.block_tables.insert(two.block_tables.end(), two.block_tables.begin(), two.block_tables.end());
  two.state_slots = {0, 0};
  two.seq_index[1] = 1;
  two.positions[1] = 0;
  EXPECT_THROW(be.forward(two, logits), Error);
  // The checks ran before any state changed: slot 1 still continues at 20.
  be.forward(row_batch(1, 20, 1), split);
}

}  // namespace
}  // namespace moebatch
