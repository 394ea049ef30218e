// The users' workload through the whole service: N requests of I input / O output tokens enter
// the SQLite queue at once, the daemon (in-process, real engine thread, real store) drains them,
// results and latency rows are written; reported are requests/s, total and output tokens/s, and
// the latency percentiles the store records. Runs on a checkpoint or on random weights of a named
// shape (--model random:qwen3-30b-a3b --backend cuda), so the 30B and seed-class shapes can be
// measured without a checkpoint file. Progress on stderr; a table last; JSON with --out.
//
//   moebatch_bench_offline --model random:qwen3-30b-a3b --backend cuda --requests 2000
//       --input-len 1024 --output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192
//   (one command line)
#include <algorithm>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/tokenizer/tokenizer.h"
#include "queue/job_store.h"
#include "service/service.h"

namespace moebatch {
namespace {

struct Options {
  ServiceConfig service;
  int64_t requests = 200;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  std::string out;
};

// `n` prompts of exactly `len` tokens each: random ids of ordinary vocabulary text, decoded and
// re-encoded until the count is exact (a decoded id sequence may re-tokenize differently).
std::vector<std::string> make_prompts(const Tokenizer& tk, int64_t n, int64_t len) {
  std::mt19937_64 rng(20261130);
  std::vector<std::string> out;
  const auto vocab = static_cast<TokenId>(std::min<size_t>(tk.vocab_size(), 150000));
  while (static_cast<int64_t>(out.size()) < n) {
    std::vector<TokenId> ids;
    while (static_cast<int64_t>(ids.size()) < len) {
      const TokenId id = static_cast<TokenId>(rng() % vocab);
      if (!tk.is_special(id)) ids.push_back(id);
    }
    std::string text = tk.decode(ids);
    for (int round = 0; round < 8; ++round) {
      std::vector<TokenId> again = tk.encode(text, /*parse_special=*/false);
      if (static_cast<int64_t>(again.size()) == len) break;
      if (static_cast<int64_t>(again.size()) > len) again.resize(static_cast<size_t>(len));
      while (static_cast<int64_t>(again.size()) < len) again.push_back(again.back());
      text = tk.decode(again);
    }
    if (static_cast<int64_t>(tk.encode(text, false).size()) == len) out.push_back(std::move(text));
  }
  return out;
}

int run(const Options& o) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "mb-offline-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  const std::filesystem::path dir = tmpl;
  ServiceConfig cfg = o.service;
  cfg.db = (dir / "jobs.db").string();
  cfg.http_port = -1;
  cfg.poll_ms = 10;
  const Tokenizer tk = Tokenizer::from_model(cfg.tokenizer.empty() ? cfg.model : cfg.tokenizer);
  spdlog::info("making {} prompts of {} tokens", o.requests, o.input_len);
  const auto prompts = make_prompts(tk, o.requests, o.input_len);
  std::vector<JobSpec> specs;
  for (const auto& p : prompts) {
    JobSpec s;
    s.prompt = p;
    s.sampling.max_tokens = o.output_len;
    s.sampling.temperature = 0;
    specs.push_back(std::move(s));
  }
  ServiceHooks hooks;
  hooks.handle_signals = false;
  Service svc(cfg, hooks);  // builds and warms up the engine before the clock starts
  StoreOptions so;
  so.path = cfg.db;
  // The latency percentiles cover every request of the run, not only the newest 10,000.
  so.stats_latency_window = std::clamp<int64_t>(o.requests, so.stats_latency_window, 1000000);
  JobStore store(so);
  int code = 0;
  std::thread t([&] { code = svc.run(); });
  const auto t0 = std::chrono::steady_clock::now();
  store.submit_many(specs);
  svc.wake();
  int64_t done = 0, last_report = -1;
  while (true) {
    const QueueStats st = store.stats();
    done = st.counts.at(JobState::Done) + st.counts.at(JobState::Failed);
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (done != last_report && (done == o.requests || static_cast<int64_t>(el) % 5 == 0)) {
      std::fprintf(stderr, "\r%lld/%lld requests, %.1f s", static_cast<long long>(done),
                   static_cast<long long>(o.requests), el);
      last_report = done;
    }
    if (done >= o.requests) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n");
  svc.stop();
  t.join();
  int64_t in_tok = 0, out_tok = 0, failed = 0;
  std::vector<double> ttft_enqueue;  // enqueued -> first token: queue wait + TTFT from claim
  ListFilter f;
  f.limit = 100000;
  for (const Job& j : store.list(f)) {
    if (!j.result) {
      ++failed;
      continue;
    }
    in_tok += j.result->prompt_tokens;
    out_tok += j.result->completion_tokens;
    if (const auto lat = store.latency(j.id); lat && lat->ttft_ms)
      ttft_enqueue.push_back(static_cast<double>(lat->queue_wait_ms + *lat->ttft_ms));
  }
  auto percentile = [&](double q) {
    if (ttft_enqueue.empty()) return 0.0;
    std::vector<double> v = ttft_enqueue;
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
  };
  const double ttft_enq_p50 = percentile(0.50), ttft_enq_p99 = percentile(0.99);
  const QueueStats st = store.stats();
  nlohmann::json r = {{"model", cfg.model},
                      {"backend", cfg.backend},
                      {"tp", cfg.tp},
                      {"requests", o.requests},
                      {"failed", failed},
                      {"input_len", o.input_len},
                      {"output_len", o.output_len},
                      {"max_num_seqs", cfg.max_num_seqs},
                      {"max_num_batched_tokens", cfg.max_num_batched_tokens},
                      {"wall_s", wall},
                      {"requests_per_s", o.requests / wall},
                      {"input_tokens", in_tok},
                      {"output_tokens", out_tok},
                      {"total_tok_s", (in_tok + out_tok) / wall},
                      {"output_tok_s", out_tok / wall},
                      {"ttft_ms_p50", st.ttft_ms.p50},
                      {"ttft_ms_p99", st.ttft_ms.p99},
                      {"ttft_from_enqueue_ms_p50", ttft_enq_p50},
                      {"ttft_from_enqueue_ms_p99", ttft_enq_p99},
                      {"total_ms_p50", st.total_ms.p50},
                      {"total_ms_p99", st.total_ms.p99},
                      {"queue_wait_ms_p50", st.queue_wait_ms.p50}};
  std::printf("offline %lld x %lld/%lld on %s (%s, tp %d), slots %lld, %lld tokens/step\n",
              static_cast<long long>(o.requests), static_cast<long long>(o.input_len),
              static_cast<long long>(o.output_len), cfg.model.c_str(), cfg.backend.c_str(), cfg.tp,
              static_cast<long long>(cfg.max_num_seqs),
              static_cast<long long>(cfg.max_num_batched_tokens));
  std::printf("  requests/s %10.2f   total tok/s %10.0f   output tok/s %10.0f   wall %.1f s\n",
              o.requests / wall, (in_tok + out_tok) / wall, out_tok / wall, wall);
  std::printf(
      "  job total ms p50 %.0f p99 %.0f (from enqueue); ttft ms p50 %.0f p99 %.0f (from "
      "claim), p50 %.0f p99 %.0f (from enqueue); failed %lld\n",
      st.total_ms.p50, st.total_ms.p99, st.ttft_ms.p50, st.ttft_ms.p99, ttft_enq_p50, ttft_enq_p99,
      static_cast<long long>(failed));
  if (!o.out.empty()) std::ofstream(o.out) << r.dump(2) << "\n";
  std::filesystem::remove_all(dir);
  return code == 0 && failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  using namespace moebatch;
  Options o;
  CLI::App app{"Offline throughput through the whole service (queue, dispatcher, engine, writer)"};
  app.add_option("--model", o.service.model, "Checkpoint dir, .gguf file, or random:<shape>")
      ->required();
  app.add_option("--tokenizer", o.service.tokenizer, "Tokenizer dir or .gguf (default: the model)");
  app.add_option("--backend", o.service.backend, "cpu | cuda");
  app.add_option("--tensor-parallel-size,--tp", o.service.tp, "Ranks");
  app.add_option("--requests", o.requests, "Requests (default 200)");
  app.add_option("--input-len", o.input_len, "Prompt tokens per request (default 1024)");
  app.add_option("--output-len", o.output_len, "Generated tokens per request (default 128)");
  app.add_option("--max-num-seqs", o.service.max_num_seqs, "Slots (default 64)");
  app.add_option("--max-num-batched-tokens", o.service.max_num_batched_tokens, "Tokens per step");
  app.add_option("--gpu-memory-utilization", o.service.gpu_memory_utilization, "cuda memory share");
  app.add_option("--kv-cache-mb", o.service.kv_cache_mb, "cpu: KV pool (0 = 256 MiB); cuda: cap (0 = none)");
  app.add_option("--threads", o.service.threads, "cpu threads");
  app.add_option("--quantization", o.service.quantization,
                 "cuda linear weights: auto | none | fp8 | nvfp4 | int4 (random models: quantized on load)");
  app.add_option("--out", o.out, "JSON result file");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offline: %s\n", e.what());
    return 2;
  }
}
