// Service overhead on CPU: N jobs run (a) through the Engine directly, tokenized up front, and
// (b) through the whole service (SQLite insert → claim → tokenize → hand-off → engine → decode →
// grouped complete with latency rows). Same model, prompts, greedy sampling and batch size;
// wall time from the first job available to the last result recorded. Prints a table and
// writes bench_service.json. Usage: bench_service [jobs=256] [max_tokens=16] [reps=3]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/factory.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "service/demo_model.h"

namespace moebatch {
// Defined in bench_service_run.cpp (queue side: the two sides cannot share a TU).
double run_through_service(const std::filesystem::path& model,
                           const std::vector<std::string>& prompts, int64_t max_tokens,
                           int64_t slots, int64_t* tokens_out);
}  // namespace moebatch

using namespace moebatch;

namespace {

std::vector<std::string> make_prompts(int64_t n) {
  std::vector<std::string> p;
  for (int64_t i = 0; i < n; ++i)
    p.push_back("Job " + std::to_string(i) + ": summarise the benefits of batching number " +
                std::to_string(i * 7 % 13) + ".");
  return p;
}

double run_engine_direct(const std::filesystem::path& model,
                         const std::vector<std::string>& prompts, int64_t max_tokens, int64_t slots,
                         int64_t* tokens_out) {
  const Tokenizer tok = Tokenizer::from_dir(model);
  EngineSpec spec;
  spec.model = model.string();
  spec.kv_cache_bytes = int64_t{64} << 20;
  spec.scheduler = {.max_num_seqs = slots, .max_num_batched_tokens = 4096};
  auto built = make_engine(spec);
  Engine& engine = *built.engine;
  // Warm up like the service does.
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.id = 1000000 + i;
    r.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 4;
    engine.add(r);
  }
  run_to_completion(engine);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = i;
    for (auto id : tok.encode(prompts[i], false)) r.prompt.push_back(static_cast<int32_t>(id));
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    for (auto id : tok.eos_ids()) r.sampling.stop_token_ids.push_back(static_cast<int32_t>(id));
    engine.add(r);
  }
  int64_t tokens = 0;
  for (auto& f : run_to_completion(engine)) {
    tokens += static_cast<int64_t>(f.tokens.size());
    (void)tok.decode(std::vector<TokenId>(f.tokens.begin(), f.tokens.end()), true);
  }
  *tokens_out = tokens;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t jobs = argc > 1 ? std::stoll(argv[1]) : 256;
  const int64_t max_tokens = argc > 2 ? std::stoll(argv[2]) : 16;
  const int reps = argc > 3 ? std::stoi(argv[3]) : 3;
  const int64_t slots = 64;
  spdlog::set_level(spdlog::level::warn);
  const auto model = ensure_demo_model(
      MOEBATCH_BENCH_CACHE, std::filesystem::path(MOEBATCH_TEST_DATA) / "qwen3-tokenizer");
  const auto prompts = make_prompts(jobs);
  std::vector<double> direct, service;
  int64_t tok_direct = 0, tok_service = 0;
  // Interleaved repetitions, best of each: the machine is shared, so the minimum is the most
  // faithful estimate of each path's own cost.
  for (int r = 0; r < reps; ++r) {
    direct.push_back(run_engine_direct(model, prompts, max_tokens, slots, &tok_direct));
    service.push_back(run_through_service(model, prompts, max_tokens, slots, &tok_service));
  }
  const double d = *std::min_element(direct.begin(), direct.end());
  const double s = *std::min_element(service.begin(), service.end());
  const double overhead = (s - d) / d * 100.0;
  std::cout << "service overhead, " << jobs << " jobs x " << max_tokens << " tokens, " << slots
            << " slots, greedy, demo model (CPU), best of " << reps << "\n";
  std::cout << "path              wall_s   tokens   tokens/s\n";
  std::printf("engine direct   %8.3f %8lld %10.1f\n", d, static_cast<long long>(tok_direct),
              tok_direct / d);
  std::printf("full service    %8.3f %8lld %10.1f\n", s, static_cast<long long>(tok_service),
              tok_service / s);
  std::printf("overhead        %+7.1f %%\n", overhead);
  nlohmann::json j{{"jobs", jobs},
                   {"max_tokens", max_tokens},
                   {"slots", slots},
                   {"direct_s", direct},
                   {"service_s", service},
                   {"tokens_direct", tok_direct},
                   {"tokens_service", tok_service},
                   {"overhead_pct", overhead}};
  std::ofstream("bench_service.json") << j.dump(2) << "\n";
  return 0;
}
