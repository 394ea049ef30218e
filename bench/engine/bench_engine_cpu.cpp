// CPU engine throughput on the tiny fixtures: prefill and decode tokens/s at batch 1 and 16.
// Prefill: every prompt of 128 tokens in one step; decode: the following 32 single-token steps.
// Prints a table and writes JSON (argv[1], default bench_engine_cpu.json).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/factory.h"
#include "engine/engine.h"

namespace {

using moebatch::SteadyClock;

struct Result {
  std::string model;
  int batch;
  double prefill_tok_s, decode_tok_s, decode_step_ms;
};

Result run(const std::string& data, const std::string& model, int batch, int threads) {
  constexpr int kPrompt = 128, kDecode = 32;
  moebatch::EngineSpec spec;
  spec.model = data + "/" + model;
  spec.threads = threads;
  spec.kv_cache_bytes = 128 << 20;
  spec.scheduler = {.max_num_seqs = batch, .max_num_batched_tokens = batch * kPrompt};
  auto built = moebatch::make_engine(spec);
  moebatch::Engine& eng = *built.engine;
  std::mt19937 rng(7);
  for (int i = 0; i < batch; ++i) {
    moebatch::Request r;
    r.id = i;
    for (int t = 0; t < kPrompt; ++t) r.prompt.push_back(static_cast<int32_t>(rng() % 1024));
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = kDecode + 1;
    eng.add(r);
  }
  auto t0 = SteadyClock::now();
  eng.step();  // prefill of all prompts + first sampled token
  auto t1 = SteadyClock::now();
  int steps = 0;
  while (!eng.idle()) {
    eng.step();
    ++steps;
  }
  auto t2 = SteadyClock::now();
  const double tp = std::chrono::duration<double>(t1 - t0).count();
  const double td = std::chrono::duration<double>(t2 - t1).count();
  return {model, batch, batch * kPrompt / tp, batch * double(kDecode) / td, 1e3 * td / steps};
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  const std::string out = argc > 1 ? argv[1] : "bench_engine_cpu.json";
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<Result> results;
  for (const char* m : {"qwen3_moe_tiny", "qwen2_moe_tiny", "qwen3_dense_tiny"}) {
    for (int b : {1, 16}) results.push_back(run(MOEBATCH_TEST_DATA, m, b, threads));
  }
  std::printf("CPU engine, fp32, %d threads, prompt 128, 32 decode steps\n", threads);
  std::printf("%-18s %5s %14s %14s %12s\n", "model", "batch", "prefill tok/s", "decode tok/s",
              "step ms");
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : results) {
    std::printf("%-18s %5d %14.0f %14.0f %12.2f\n", r.model.c_str(), r.batch, r.prefill_tok_s,
                r.decode_tok_s, r.decode_step_ms);
    j.push_back({{"model", r.model},
                 {"batch", r.batch},
                 {"prefill_tok_s", r.prefill_tok_s},
                 {"decode_tok_s", r.decode_tok_s},
                 {"decode_step_ms", r.decode_step_ms},
                 {"threads", threads}});
  }
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
