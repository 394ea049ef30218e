// Engine behaviour: batch invariance, decode-with-cache vs full recompute, chunked prefill,
// sampling (seeded, per-request), stop tokens, max_tokens, slot refill, request validation;
// plus the CPU ops against naive references on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "common/error.h"
#include "engine/cpu/comm.h"
#include "engine/cpu/ops.h"
#include "tests/common/prompts.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

using test::random_prompt;
using test::read_file;
using test::TempDir;
using test::write_file;

std::mt19937 fresh_rng() { return std::mt19937(std::random_device{}()); }

// These tests compare logits: their greedy requests keep them.
Request greedy_logged(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens) {
  return greedy_request(id, std::move(prompt), max_tokens, /*keep_logits=*/true);
}

TEST(CpuOps, MatmulMatchesNaiveAndIsRowIndependent) {
  auto rng = fresh_rng();
  std::normal_distribution<float> nd;
  ThreadPool pool(2);
  const int64_t n = 1 + rng() % 9, k = 1 + rng() % 70, m = 1 + rng() % 40;
  std::vector<float> x(n * k), w(m * k), bias(m), y(n * m);
  for (auto* v : {&x, &w, &bias})
    for (auto& e : *v) e = nd(rng);
  cpu::matmul(pool, x.data(), n, k, w.data(), m, bias.data(), y.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = bias[j];
      for (int64_t c = 0; c < k; ++c) ref += double(x[i * k + c]) * w[j * k + c];
      EXPECT_NEAR(y[i * m + j], ref, 1e-5 * (1 + std::sqrt(double(k))));
    }
  }
  // One row alone gives bitwise the same result as inside the batch.
  std::vector<float> y1(m);
  ThreadPool single(1);
  cpu::matmul(single, x.data() + (n - 1) * k, 1, k, w.data(), m, bias.data(), y1.data());
  for (int64_t j = 0; j < m; ++j) EXPECT_EQ(y1[j], y[(n - 1) * m + j]);
}

TEST(CpuOps, RopeRotatesHalvesAndPreservesNorm) {
  auto rng = fresh_rng();
  std::normal_distribution<float> nd;
  const int64_t hd = 16, heads = 3;
  std::vector<float> x(heads * hd);
  for (auto& v : x) v = nd(rng);
  auto orig = x;
  int32_t pos = static_cast<int32_t>(rng() % 1000);
  cpu::rope_neox(x.data(), &pos, 1, heads, hd, hd, 10000.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      double a = pos * std::pow(10000.0, -2.0 * i / hd);
      double x0 = orig[h * hd + i], x1 = orig[h * hd + i + hd / 2];
      EXPECT_NEAR(x[h * hd + i], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
      EXPECT_NEAR(x[h * hd + i + hd / 2], x1 * std::cos(a) + x0 * std::sin(a), 1e-5);
    }
  }
}

TEST(CpuOps, RouterTopkSoftmaxAndRenorm) {
  auto rng = fresh_rng();
  std::normal_distribution<float> nd;
  const int64_t E = 8, k = 3;
  std::vector<float> logits(E);
  for (auto& v : logits) v = nd(rng);
  std::vector<int32_t> ids(k);
  std::vector<float> w(k), wn(k);
  cpu::route_topk(logits.data(), E, k, false, ids.data(), w.data());
  cpu::route_topk(logits.data(), E, k, true, ids.data(), wn.data());
  double z = 0;
  for (auto v : logits) z += std::exp(double(v));
  std::vector<int32_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double ks = 0;
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(ids[i], order[i]);
    EXPECT_NEAR(w[i], std::exp(double(logits[order[i]])) / z, 1e-6);
    ks += w[i];
  }
  for (int i = 0; i < k; ++i) EXPECT_NEAR(wn[i], w[i] / ks, 1e-6);
}

TEST(Comm, AllReduceAndGatherAcrossThreads) {
  auto rng = fresh_rng();
  const int world = 4;
  const size_t n = 37;
  InProcessComm comm(world);
  std::vector<std::vector<float>> data(world, std::vector<float>(n));
  std::vector<double> want(n, 0);
  for (auto& d : data)
    for (size_t i = 0; i < n; ++i) want[i] += d[i] = float(rng() % 1000) / 7;
  // all_gather: rank r sends {r, r + 0.5, r + 0.25}; every rank receives [world, 3].
  std::vector<std::vector<float>> gathered(world, std::vector<float>(3 * world, -1.0f));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      comm.all_reduce_sum(r, data[r].data(), n, CommDType::F32, nullptr);
      std::vector<float> local = {float(r), float(r) + 0.5f, float(r) + 0.25f};
      comm.all_gather(r, local.data(), gathered[r].data(), 3, CommDType::F32, nullptr);
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(data[r][i], want[i], 1e-3);
      EXPECT_EQ(data[r][i], data[0][i]);
    }
  for (int me = 0; me < world; ++me)
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(gathered[me][r * 3 + 0], float(r));
      EXPECT_EQ(gathered[me][r * 3 + 1], r + 0.5f);
      EXPECT_EQ(gathered[me][r * 3 + 2], r + 0.25f);
    }
}

TEST(Sampler, GreedyTopKTopPAndSeeding) {
  auto rng = fresh_rng();
  std::normal_distribution<float> nd(0, 2);
  const int64_t V = 50;
  std::vector<float> logits(V);
  for (auto& v : logits) v = nd(rng);
  GenerationParams p;
  EXPECT_EQ(p.temperature, 1.0f) << "OpenAI's default, as the job queue's";
  p.temperature = 0.0f;
  EXPECT_EQ(sample_token(logits.data(), V, p, 0),
            std::max_element(logits.begin(), logits.end()) - logits.begin());
  p.temperature = 1.0f;
  p.seed = rng();
  p.top_k = 3;
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::map<int32_t, int> counts;
  for (int i = 0; i < 3000; ++i) counts[sample_token(logits.data(), V, p, i)]++;
  for (auto [tok, c] : counts) {
    EXPECT_TRUE(tok == order[0] || tok == order[1] || tok == order[2]) << tok;
  }
  // Empirical frequencies follow the softmax over the top 3 (binomial 5-sigma bound).
  double z = 0;
  for (int i = 0; i < 3; ++i) z += std::exp(double(logits[order[i]]) - logits[order[0]]);
  for (int i = 0; i < 3; ++i) {
    double pi = std::exp(double(logits[order[i]]) - logits[order[0]]) / z;
    EXPECT_NEAR(counts[order[i]] / 3000.0, pi, 5 * std::sqrt(pi * (1 - pi) / 3000) + 1e-3);
  }
  // top_p smaller than the top token's mass keeps only the top token.
  p.top_k = 0;
  p.top_p = 1e-6f;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits.data(), V, p, i), order[0]);
  // The draw depends only on (seed, step): the same pair gives the same token, another seed
  // gives another stream.
  p.top_p = 1.0f;
  GenerationParams other = p;
  other.seed = p.seed + 1;
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_token(logits.data(), V, p, i), sample_token(logits.data(), V, p, i));
    differ += sample_token(logits.data(), V, p, i) != sample_token(logits.data(), V, other, i);
  }
  EXPECT_GT(differ, 0);
  auto bad = [&](auto mutate) {
    GenerationParams q;
    mutate(q);
    return q;
  };
  EXPECT_THROW(validate_sampling(bad([](GenerationParams& q) { q.temperature = -1; }), V),
               InputError);
  EXPECT_THROW(validate_sampling(bad([](GenerationParams& q) { q.top_p = 0; }), V), InputError);
  EXPECT_THROW(validate_sampling(bad([](GenerationParams& q) { q.max_tokens = 0; }), V),
               InputError);
  EXPECT_THROW(
      validate_sampling(bad([&](GenerationParams& q) { q.stop_token_ids = {int32_t(V)}; }), V),
      InputError);
}

// Decode with the KV cache must equal recomputing the whole sequence at every step.
TEST(Engine, DecodeWithCacheEqualsFullRecompute) {
  auto rng = fresh_rng();
  for (const char* model : {"qwen3_moe_tiny", "qwen2_moe_tiny", "qwen3_dense_tiny"}) {
    auto eng = make_engine(model);
    const int64_t V = eng->config().vocab_size;
    auto prompt = random_prompt(rng, 5 + rng() % 20, V);
    eng->add(greedy_logged(1, prompt, 12));
    auto fin = run_to_completion(*eng);
    ASSERT_EQ(fin.size(), 1u);
    ASSERT_EQ(fin[0].tokens.size(), 12u);
    auto seq = prompt;
    seq.insert(seq.end(), fin[0].tokens.begin(), fin[0].tokens.end() - 1);
    auto full = eng->score(seq);
    for (size_t s = 0; s < 12; ++s) {
      const float* rec = full.data() + (prompt.size() - 1 + s) * V;
      EXPECT_LT(rel_err(fin[0].logits.data() + s * V, rec, V), 1e-5) << model << " step " << s;
    }
  }
}

// A sequence's tokens and logits are bitwise the same alone and among other sequences, with
// chunked prefill and slots refilled mid-run.
TEST(Engine, BatchNeighboursChangeNothing) {
  auto rng = fresh_rng();
  auto alone = make_engine("qwen3_moe_tiny");
  const int64_t V = alone->config().vocab_size;
  auto prompt = random_prompt(rng, 20 + rng() % 30, V);
  Request a = greedy_logged(0, prompt, 10);
  a.sampling.temperature = 0.8f;
  a.sampling.top_p = 0.9f;
  a.sampling.seed = rng();
  alone->add(a);
  auto ref = run_to_completion(*alone);
  auto busy = make_engine("qwen3_moe_tiny", 1, {.max_num_seqs = 3, .max_num_batched_tokens = 24});
  for (uint64_t id = 1; id <= 5; ++id) {
    Request o = greedy_logged(id, random_prompt(rng, 3 + rng() % 40, V), 2 + rng() % 12);
    o.sampling.temperature = 1.0f;
    o.sampling.seed = rng();
    busy->add(o);
    if (id == 2) busy->add(a);  // joins while others are in flight
  }
  auto all = run_to_completion(*busy);
  ASSERT_EQ(all.size(), 6u);
  for (const auto& f : all) {
    if (f.id != 0) continue;
    EXPECT_EQ(f.tokens, ref[0].tokens);
    EXPECT_EQ(f.logits, ref[0].logits);  // exact: no op depends on batch composition
  }
}

TEST(Engine, TensorParallelGenerationMatches) {
  auto rng = fresh_rng();
  auto prompt = random_prompt(rng, 16, 1024);
  std::vector<std::vector<float>> logits;
  for (int tp : {1, 2, 4}) {
    auto eng = make_engine("qwen2_moe_tiny", tp);
    eng->add(greedy_logged(0, prompt, 6));
    logits.push_back(run_to_completion(*eng)[0].logits);
  }
  for (size_t i = 1; i < logits.size(); ++i)
    for (size_t s = 0; s < 6; ++s)
      EXPECT_LT(rel_err(logits[i].data() + s * 1024, logits[0].data() + s * 1024, 1024), 1e-5);
}

TEST(Engine, StopTokensMaxTokensAndSlotRefill) {
  auto rng = fresh_rng();
  auto eng = make_engine("qwen3_dense_tiny", 1, {.max_num_seqs = 2, .max_num_batched_tokens = 64});
  const int64_t V = eng->config().vocab_size;
  auto prompt = random_prompt(rng, 8, V);
  eng->add(greedy_logged(0, prompt, 8));
  auto free_run = run_to_completion(*eng);
  ASSERT_EQ(free_run[0].reason, FinishReason::Length);
  ASSERT_EQ(free_run[0].tokens.size(), 8u);
  // Stop at the 4th generated token (first occurrence of that id).
  const int32_t stop = free_run[0].tokens[3];
  size_t first = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), stop) -
                 free_run[0].tokens.begin();
  Request r = greedy_logged(1, prompt, 8);
  r.sampling.stop_token_ids = {stop};
  for (uint64_t id = 10; id < 15; ++id) eng->add(greedy_logged(id, random_prompt(rng, 4, V), 3));
  eng->add(r);
  EXPECT_FALSE(eng->idle());
  size_t steps = 0;
  std::vector<FinishedSequence> all;
  while (!eng->idle()) {
    for (auto& f : eng->step()) all.push_back(std::move(f));
    ++steps;
    ASSERT_LT(steps, 200u);
  }
  ASSERT_EQ(all.size(), 6u);
  for (const auto& f : all) {
    if (f.id == 1) {
      EXPECT_EQ(f.reason, FinishReason::StopToken);
      EXPECT_EQ(f.tokens.size(), first + 1);
      EXPECT_EQ(f.tokens.back(), stop);
    } else {
      EXPECT_EQ(f.tokens.size(), 3u);
      EXPECT_GE(f.time_to_first_token_s, 0.0);
      EXPECT_GE(f.total_s, f.time_to_first_token_s);
    }
  }
}

TEST(Engine, RejectsBadRequests) {
  auto eng = make_engine("qwen3_dense_tiny");
  EXPECT_THROW(eng->add(greedy_logged(0, {}, 4)), InputError);
  EXPECT_THROW(eng->add(greedy_logged(0, {1, 1024}, 4)), InputError);
  EXPECT_THROW(eng->add(greedy_logged(0, {1, -1}, 4)), InputError);
  EXPECT_THROW(eng->add(greedy_logged(0, {1}, 5000)), InputError);  // > max_position_embeddings
  EXPECT_TRUE(eng->idle());
  EXPECT_THROW(make_engine("qwen3_dense_tiny", 3), InputError);  // 8 heads over 3 ranks
}

TEST(Engine, MalformedCheckpointDirectoryIsClearError) {
  TempDir tmp;
  std::filesystem::copy_file(test_data_dir() + "/qwen3_moe_tiny/config.json",
                             tmp.path() / "config.json");
  // Truncated copy of the real weights file.
  const std::string bytes = read_file(test_data_dir() + "/qwen3_moe_tiny/model.safetensors");
  write_file(tmp.path() / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  EngineSpec spec;
  spec.model = tmp.path().string();
  try {
    make_engine(spec);
    FAIL() << "no error";
  } catch (const InputError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("model.safetensors"), std::string::npos) << w;
    EXPECT_NE(w.find("outside the"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace moebatch
