// Unit tests of the service's pieces: config (file, flags, bounds), restart schedule, hand-off
// contract, Prometheus rendering. The restart schedule has its own file.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/device_query.h"
#include "service/config.h"
#include "service/handoff.h"
#include "service/load_progress.h"
#include "service/metrics.h"
#include "service/process_stats.h"
#include "service/service_db.h"
#include "tests/common/files.h"

namespace moebatch {
namespace {

/// The effective config `moebatch serve` builds from these command-line flags.
ServiceConfig parse_service_flags(std::vector<std::string> args) {
  CLI::App app;
  auto flags = add_service_flags(app);
  args.insert(args.begin(), "x");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return finish_service_flags(*flags, app);
}

TEST(Config, FileThenFlagsWinAndBoundsAreChecked) {
  test::TempDir dir;
  const auto file = dir.path() / "svc.json";
  test::write_file(file, R"({"db": "a.db", "model": "m", "max_num_seqs": 8,
                             "max_num_batched_tokens": 256, "batching": "static"})");
  ServiceConfig cfg = parse_service_flags({"--config", file.string(), "--max-num-seqs", "16"});
  EXPECT_EQ(cfg.db, "a.db");
  EXPECT_EQ(cfg.max_num_seqs, 16);  // flag beats file
  EXPECT_EQ(cfg.max_num_batched_tokens, 256);
  EXPECT_EQ(cfg.batching, BatchingMode::Static);
  EXPECT_EQ(cfg.lease_s, 60);  // default kept
  EXPECT_EQ(config_to_json(cfg)["batching"], "static");

  ServiceConfig c;
  EXPECT_THROW(apply_config_json(nlohmann::json{{"nope", 1}}, "t", c), InputError);
  EXPECT_THROW(apply_config_json(nlohmann::json{{"tp", 0}}, "t", c), InputError);
  EXPECT_THROW(apply_config_json(nlohmann::json{{"lease_s", "60"}}, "t", c), InputError);
  EXPECT_THROW(apply_config_json(nlohmann::json::array(), "t", c), InputError);
  c.db = "x";
  c.model = "m";
  validate_config(c);
  c.max_num_batched_tokens = 8;  // fewer than the slots' decode tokens
  EXPECT_THROW(validate_config(c), InputError);
  c.max_num_batched_tokens = 4096;
  c.http_host = "0.0.0.0";  // health/metrics never leave loopback
  EXPECT_THROW(validate_config(c), InputError);
  c.http_host = "127.0.0.1";
  c.lease_s = 0;
  EXPECT_THROW(validate_config(c), InputError);
  test::write_file(dir.path() / "bad.json", "{not json");
  EXPECT_THROW(load_config_file(dir.path() / "bad.json", c), InputError);
}

TEST(Config, BackendAndGpuMemoryUtilizationFromFileAndFlags) {
  test::TempDir dir;
  const auto file = dir.path() / "svc.json";
  test::write_file(file, R"({"db": "a.db", "model": "m", "backend": "cuda",
                             "gpu_memory_utilization": 0.5})");
  {
    ServiceConfig cfg = parse_service_flags({"--config", file.string()});
    EXPECT_EQ(cfg.backend, "cuda");
    EXPECT_DOUBLE_EQ(cfg.gpu_memory_utilization, 0.5);
    EXPECT_DOUBLE_EQ(config_to_json(cfg)["gpu_memory_utilization"].get<double>(), 0.5);
  }
  {
    ServiceConfig cfg = parse_service_flags(
        {"--config", file.string(), "--backend", "cpu", "--gpu-memory-utilization", "0.75"});
    EXPECT_EQ(cfg.backend, "cpu");  // flag beats file
    EXPECT_DOUBLE_EQ(cfg.gpu_memory_utilization, 0.75);
  }
  ServiceConfig c;
  c.db = "x";
  c.model = "m";
  EXPECT_DOUBLE_EQ(c.gpu_memory_utilization, 0.90);
  EXPECT_THROW(apply_config_json(nlohmann::json{{"gpu_memory_utilization", "0.5"}}, "t", c),
               InputError);
  for (double bad : {0.0, -0.1, 1.01, std::nan("")}) {
    c.gpu_memory_utilization = bad;
    EXPECT_THROW(validate_config(c), InputError) << bad;
  }
  c.gpu_memory_utilization = 1.0;
  validate_config(c);
  c.backend = "rocm";
  EXPECT_THROW(validate_config(c), InputError);
  c.backend = "cuda";
  c.tp = 2;  // tensor parallel over two GPUs: the engine factory checks what the machine has
  validate_config(c);
}

// The engine knobs of multi-GPU and compressed-weight serving: vLLM's flag names, JSON keys with
// underscores, values checked before any engine is built.
TEST(Config, ParallelismAndQuantizationKnobs) {
  test::TempDir dir;
  const auto file = dir.path() / "svc.json";
  test::write_file(file, R"({"db": "a.db", "model": "m", "backend": "cuda", "tp": 2,
                             "enable_expert_parallel": true, "quantization": "fp8",
                             "collective_timeout_s": 30, "disable_custom_all_reduce": true})");
  {
    const ServiceConfig cfg = parse_service_flags({"--config", file.string()});
    EXPECT_EQ(cfg.tp, 2);
    EXPECT_TRUE(cfg.enable_expert_parallel);
    EXPECT_TRUE(cfg.disable_custom_all_reduce);
    EXPECT_EQ(cfg.quantization, "fp8");
    EXPECT_EQ(cfg.collective_timeout_s, 30);
    EXPECT_EQ(config_to_json(cfg)["enable_expert_parallel"], true);
  }
  {
    const ServiceConfig cfg = parse_service_flags(
        {"--db", "a.db", "--model", "m", "--tensor-parallel-size", "4", "--enable-expert-parallel",
         "--quantization", "nvfp4", "--collective-timeout-s", "45"});
    EXPECT_EQ(cfg.tp, 4);
    EXPECT_TRUE(cfg.enable_expert_parallel);
    EXPECT_FALSE(cfg.disable_custom_all_reduce);
    EXPECT_EQ(cfg.quantization, "nvfp4");
    EXPECT_EQ(cfg.collective_timeout_s, 45);
  }
  ServiceConfig c;
  c.db = "x";
  c.model = "m";
  // No KV cap by default: the CUDA memory plan gives the pool what weights leave (a 256 MiB
  // default cap refused the 30B model); the cpu backend takes 0 as its 256 MiB pool.
  EXPECT_EQ(c.kv_cache_mb, 0);
  validate_config(c);
  EXPECT_FALSE(c.enable_expert_parallel);
  EXPECT_EQ(c.quantization, "auto");
  EXPECT_THROW(apply_config_json(nlohmann::json{{"enable_expert_parallel", 1}}, "t", c),
               InputError);
  c.collective_timeout_s = 0;
  EXPECT_THROW(validate_config(c), InputError);
  c.collective_timeout_s = 120;
  c.quantization = "int3";
  try {
    validate_config(c);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, none, fp8, nvfp4 or int4"), std::string::npos);
  }
}

TEST(Handoff, BoundedFifoAndCloseWakesConsumers) {
  Handoff<int> h(2);
  EXPECT_TRUE(h.try_push(1));
  EXPECT_TRUE(h.try_push(2));
  EXPECT_FALSE(h.try_push(3));  // full: never blocks
  EXPECT_EQ(*h.try_pop(), 1);
  EXPECT_TRUE(h.try_push(3));
  EXPECT_EQ(h.take_all(), (std::vector<int>{2, 3}));
  EXPECT_FALSE(h.try_pop());
  std::thread consumer([&] { EXPECT_FALSE(h.pop_for(std::chrono::seconds(30))); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  h.close();
  consumer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE(h.try_push(4));
}

TEST(Handoff, OrderedPushLetsHigherPriorityOvertakeAndKeepsFifoWithinOne) {
  // (priority, id) pairs; higher priority first, equal priorities in arrival order.
  using Item = std::pair<int, int>;
  Handoff<Item> h(5);
  auto before = [](const Item& a, const Item& b) { return a.first > b.first; };
  EXPECT_TRUE(h.try_push_ordered({0, 1}, before));
  EXPECT_TRUE(h.try_push_ordered({0, 2}, before));
  EXPECT_TRUE(h.try_push_ordered({9, 3}, before));
  EXPECT_TRUE(h.try_push_ordered({9, 4}, before));
  EXPECT_TRUE(h.try_push_ordered({5, 5}, before));
  EXPECT_FALSE(h.try_push_ordered({99, 6}, before));  // full
  EXPECT_EQ(h.take_all(), (std::vector<Item>{{9, 3}, {9, 4}, {5, 5}, {0, 1}, {0, 2}}));
}

// A held lock is tolerated for the grace period, any other failure is at once; writes back off
// while failing, logs are rate-limited, and one commit clears it all.
TEST(StoreHealth, LockGraceBackoffAndRecovery) {
  StoreHealth h(300);
  EXPECT_FALSE(h.failing());
  EXPECT_TRUE(h.may_try(0));
  const std::string locked = "SQLite call failed (BEGIN IMMEDIATE): database is locked [code 5]";
  h.write_failed(locked, 1000);
  EXPECT_TRUE(h.failing());
  EXPECT_FALSE(h.unwritable(1200));
  EXPECT_TRUE(h.unwritable(1300));
  EXPECT_FALSE(h.may_try(1010));  // 50 ms backoff after the first failure
  EXPECT_TRUE(h.may_try(1050));
  EXPECT_TRUE(h.log_due(1000));
  h.write_failed(locked, 1050);
  EXPECT_FALSE(h.may_try(1140));  // then 100 ms
  EXPECT_TRUE(h.may_try(1150));
  EXPECT_FALSE(h.log_due(1050));
  EXPECT_TRUE(h.log_due(11000));
  for (int i = 0; i < 10; ++i) h.write_failed(locked, 2000);
  EXPECT_FALSE(h.may_try(2999));  // capped at 1 s
  EXPECT_TRUE(h.may_try(3000));
  EXPECT_EQ(h.failures(), 12);
  h.write_ok();
  EXPECT_FALSE(h.failing());
  EXPECT_FALSE(h.unwritable(5000));
  EXPECT_TRUE(h.may_try(0));
  h.write_failed("SQL failed (COMMIT): database or disk is full [code 13]", 6000);
  EXPECT_TRUE(h.unwritable(6000));  // a full disk needs no grace
  EXPECT_EQ(h.failures_in_a_row(), 1);
  EXPECT_EQ(h.failures(), 13);
  // PostgreSQL's errors as PgError words them: a lock wait, a deadlock and a serialization
  // failure are another session's lock; a full disk and a lost connection are not. (The
  // lock_timeout case is also produced by a real server in ServiceDbPg.*.)
  for (const char* state : {"55P03", "40P01", "40001"}) {
    EXPECT_TRUE(StoreHealth::is_lock_failure(
        std::string("PostgreSQL (db on /tmp) failed (UPDATE jobs ...): ERROR: x [SQLSTATE ") +
        state + "]"))
        << state;
  }
  EXPECT_FALSE(StoreHealth::is_lock_failure(
      "PostgreSQL (db) failed (COMMIT): ERROR: could not extend file [SQLSTATE 53100]"));
  EXPECT_FALSE(StoreHealth::is_lock_failure("PostgreSQL connection to db lost: no route"));
  h.write_ok();
  h.write_failed("PostgreSQL (db) failed (INSERT): ERROR: deadlock detected [SQLSTATE 40P01]",
                 7000);
  EXPECT_FALSE(h.unwritable(7000));
  EXPECT_TRUE(h.unwritable(7300));
}

// Every sample belongs to a family declared with # TYPE before it (histograms by their
// _bucket, _sum and _count series), and every value parses as a number.
void expect_well_formed_exposition(const std::string& text) {
  std::set<std::string> declared;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      declared.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (!declared.count(name) && name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0)
        name.resize(name.size() - s.size());
    }
    EXPECT_TRUE(declared.count(name)) << "no # TYPE before: " << line;
    const std::string value = line.substr(line.rfind(' ') + 1);
    size_t used = 0;
    EXPECT_NO_THROW((void)std::stod(value, &used)) << line;
    EXPECT_EQ(used, value.size()) << line;
  }
}

TEST(Metrics, PrometheusTextHasCountersGaugesAndHistogramsButNoRates) {
  ServiceMetrics m;
  m.job_done(0.001, 0.2, 3.0, 10);
  m.job_done(0.02, 0.3, 4.0, 6);
  m.job_failed();
  m.restart(true, 2.0);
  MetricsInputs in;
  in.queue_depth = {{"queued", 5}, {"done", 2}};
  in.engine_steps = 20;
  in.engine_slot_steps = 120;
  in.max_num_seqs = 8;
  in.engine_tokens = 36;
  in.engine_prompt_tokens = 300;
  in.engine_active = 7;
  in.engine_running = 6;
  in.kv_reserved_tokens = 1024;
  in.kv_capacity_tokens = 4096;
  in.kv_bytes_per_token = 512;
  in.process = read_process_stats();
  const std::string t = m.render(in);
  expect_well_formed_exposition(t);
  EXPECT_NE(t.find("moebatch_queue_jobs{state=\"queued\"} 5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_jobs_done_total 2\n"), std::string::npos);
  EXPECT_NE(t.find("moebatch_jobs_failed_total 1\n"), std::string::npos);
  EXPECT_NE(t.find("moebatch_restarts_total{result=\"ok\"} 1\n"), std::string::npos);
  EXPECT_NE(
      t.find("# TYPE moebatch_prompt_tokens_total counter\nmoebatch_prompt_tokens_total 300\n"),
      std::string::npos)
      << t;
  EXPECT_NE(t.find("# TYPE moebatch_generation_tokens_total counter\n"
                   "moebatch_generation_tokens_total 36\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("moebatch_engine_slots 8\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_engine_slots_busy 6\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_engine_slots_usage_ratio 0.75\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_kv_cache_used_tokens 1024\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_kv_cache_capacity_tokens 4096\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_kv_cache_capacity_bytes 2097152\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_kv_cache_usage_ratio 0.25\n"), std::string::npos) << t;
  // Rates are the scraper's job (rate() over the counters).
  EXPECT_EQ(t.find("per_second"), std::string::npos) << t;
  EXPECT_EQ(t.find("occupancy"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_build_info{version=\""), std::string::npos) << t;
  // Cumulative buckets: 0.001 <= 0.005; 0.02 <= 0.025.
  EXPECT_NE(t.find("moebatch_queue_wait_seconds_bucket{le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("moebatch_queue_wait_seconds_bucket{le=\"0.025\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("moebatch_job_total_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("moebatch_job_total_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE moebatch_ttft_seconds histogram\n"), std::string::npos);
  EXPECT_EQ(t.find("moebatch_gpu_memory"), std::string::npos) << "no GPU gauges off the GPU";
  for (const char* family : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                             "process_open_fds", "process_start_time_seconds"})
    EXPECT_NE(t.find(std::string("\n") + family + " "), std::string::npos) << family;
}

TEST(Metrics, ProcessStatsComeFromProc) {
  const auto before = read_process_stats();
  ASSERT_TRUE(before.has_value());
  // Burn a little CPU and open a descriptor: both must show.
  volatile double x = 0;
  for (int i = 0; i < 20'000'000; ++i) x = x + 1e-9 * i;
  test::TempDir dir;
  std::FILE* f = std::fopen((dir.path() / "f").c_str(), "w");
  ASSERT_NE(f, nullptr);
  const auto after = read_process_stats();
  std::fclose(f);
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->cpu_seconds, before->cpu_seconds);
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_GT(after->resident_bytes, 1 << 20);
  EXPECT_GT(after->virtual_bytes, after->resident_bytes);
  EXPECT_GT(after->max_fds, 0);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(after->start_time_seconds, now + 1);
  EXPECT_GT(after->start_time_seconds, now - 3600) << "the test process started this hour";
}

TEST(LoadProgress, LineAndModelBytes) {
  EXPECT_EQ(load_progress_line(1'250'000'000, 4'000'000'000, 0.5),
            "loading model: 1.25 / 4.00 GB (31%), 2.50 GB/s");
  // Estimates past the end (other mappings count too) are shown as done, not 120%.
  EXPECT_EQ(load_progress_line(5'000'000'000, 4'000'000'000, 2.0),
            "loading model: 4.00 / 4.00 GB (100%), 2.00 GB/s");
  test::TempDir dir;
  test::write_file(dir.path() / "model-00001.safetensors", std::string(1000, 'x'));
  test::write_file(dir.path() / "model-00002.safetensors", std::string(24, 'x'));
  test::write_file(dir.path() / "config.json", "{}");
  EXPECT_EQ(model_file_bytes(dir.path().string()), 1024);
  EXPECT_EQ(model_file_bytes((dir.path() / "model-00002.safetensors").string()), 24);
  EXPECT_EQ(model_file_bytes("random:tiny"), 0);
  EXPECT_EQ(model_file_bytes((dir.path() / "missing").string()), 0);
}

TEST(Metrics, GpuMemoryGaugesPerDeviceOnlyWhenTheBackendReportsThem) {
  ServiceMetrics m;
  MetricsInputs in;
  // exact integers, not 1.6e+11
  in.gpus.push_back({"cuda:0", int64_t{150} << 30, int64_t{141} << 30});
  in.gpus.push_back({"cuda:1", int64_t{7} << 30, int64_t{141} << 30});
  const std::string t = m.render(in);
  EXPECT_NE(t.find("# TYPE moebatch_gpu_memory_used_bytes gauge\n"), std::string::npos) << t;
  EXPECT_NE(t.find("moebatch_gpu_memory_used_bytes{device=\"cuda:0\"} 161061273600\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("moebatch_gpu_memory_used_bytes{device=\"cuda:1\"} 7516192768\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("moebatch_gpu_memory_total_bytes{device=\"cuda:1\"} 151397597184\n"),
            std::string::npos)
      << t;
  // With the CPU backend the worker reports none: the service leaves the gauges out.
  EXPECT_FALSE(gpu_memory(0).has_value() && !cuda_backend_built());
}

}  // namespace
}  // namespace moebatch
