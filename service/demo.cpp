#include "service/demo.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/error.h"
#include "queue/job_store.h"
#include "queue/store_url.h"
#include "queue/zmq/client.h"
#include "queue/zmq/ingress.h"
#include "service/demo_model.h"
#include "service/service.h"
#include "service/service_db.h"

namespace moebatch {
namespace {

const char* const kTopics[] = {"mixture-of-experts routing",
                               "SQLite write-ahead logging",
                               "batch inference",
                               "tensor parallelism",
                               "paged KV caches",
                               "ZeroMQ sockets",
                               "nightly restarts",
                               "tail latency",
                               "token sampling",
                               "chunked prefill",
                               "lease-based job queues",
                               "Prometheus metrics"};

std::string text_prompt(int64_t i) {
  return fmt::format("Job {}: write two sentences about {}.", i, kTopics[i % 12]);
}

std::string chat_prompt(int64_t i) {
  nlohmann::json m = nlohmann::json::array(
      {{{"role", "system"}, {"content", "You are a concise assistant."}},
       {{"role", "user"},
        {"content", fmt::format("Question {}: what is {}?", i, kTopics[i % 12])}}});
  return m.dump();
}

// A string as an SQL literal that SQLite and PostgreSQL read alike: quotes doubled, nothing
// else escaped (PostgreSQL's standard_conforming_strings, on by default since 9.1).
std::string sql_literal(const std::string& v) {
  std::string out = "'";
  for (char c : v) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

// An external producer: plain SQL INSERTs in one transaction, as schemas/README.md describes;
// the same statements on either database.
void insert_with_sql(ServiceDb& db, int64_t first, int64_t count, int64_t max_tokens) {
  std::string sql;
  for (int64_t i = first; i < first + count; ++i) {
    sql += fmt::format(
        "INSERT INTO jobs (client_key, batch_id, prompt_kind, prompt, max_tokens, temperature, "
        "priority) VALUES ('demo-sql-{}', 'demo-sql', '{}', {}, {}, 0, {});\n",
        i, i % 2 ? "chat" : "text", sql_literal(i % 2 ? chat_prompt(i) : text_prompt(i)),
        max_tokens, i % 10 == 0 ? 5 : 0);
  }
  try {
    db.exec_producer_sql(sql);
  } catch (const Error& e) {
    throw Error(std::string("demo: SQL producer failed: ") + e.what());
  }
}

// Jobs submitted by the ZeroMQ producer, with their idempotency keys.
std::vector<JobSpec> zmq_specs(int64_t first, int64_t count, int64_t max_tokens) {
  std::vector<JobSpec> specs;
  for (int64_t i = first; i < first + count; ++i) {
    JobSpec s;
    // The idempotency key: a message resent after a lost ack maps to the same jobs.
    s.client_key = fmt::format("demo-zmq-{}", i);
    s.batch_id = "demo-zmq";
    s.prompt_kind = i % 3 == 0 ? PromptKind::Chat : PromptKind::Text;
    s.prompt = s.prompt_kind == PromptKind::Chat ? chat_prompt(i) : text_prompt(i);
    s.sampling.max_tokens = max_tokens;
    // Qwen3's recommended sampling; the top-k cut also keeps the CPU sampler from sorting the
    // whole 151k vocabulary per token.
    s.sampling.temperature = 0.7;
    s.sampling.top_k = 20;
    s.sampling.top_p = 0.8;
    s.sampling.seed = i;
    specs.push_back(std::move(s));
  }
  return specs;
}

// What the ZeroMQ producer saw: jobs created, messages (with retries) and the ids of a resent
// message that came back as already known.
struct ZmqTally {
  int64_t created = 0;
  int64_t sends = 0;
  int64_t resent_known = 0;
};

int64_t done_in_batch(JobStore& store, const char* batch) {
  ListFilter f;
  f.state = JobState::Done;
  f.batch_id = batch;
  f.limit = 100000;
  return static_cast<int64_t>(store.list(f).size());
}

// Nearest-rank percentile.
double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

int run_service_demo(const DemoOptions& o, std::ostream& out) {
  if (o.jobs < 1 || o.jobs > 100000) throw InputError("--jobs must be in [1, 100000]");
  if (o.max_tokens < 1 || o.max_tokens > 512) throw InputError("--max-tokens must be in [1, 512]");
  // $MOEBATCH_DEMO_ARCH=qwen3_next runs the hybrid model instead (the GPU end-to-end scripts
  // get its directory this way).
  const DemoModelSpec spec = demo_model_spec_from_env();
  out << "moebatch demo\n"
      << fmt::format("NOTE: the bundled model is a tiny {} with RANDOM weights. ",
                     demo_arch_name(spec.arch))
      << "Its text is gibberish;\n"
      << "      what the demo shows is the pipeline: queue -> tokenizer -> batched MoE engine ->\n"
      << "      results with latency records.\n\n";
  const auto model = ensure_demo_model(default_cache_dir(), find_bundled_tokenizer(), spec);

  // A SQLite file or a postgresql:// URL (--db); a temporary SQLite file without one.
  std::filesystem::path dir;
  std::string db_path = o.db;
  if (db_path.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moebatch-demo-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory for the demo");
    dir = tmpl;
    db_path = (dir / "jobs.db").string();
  }

  ServiceConfig cfg;
  cfg.db = db_path;
  cfg.model = model.string();
  cfg.max_num_seqs = o.max_num_seqs;
  cfg.max_num_batched_tokens = std::max<int64_t>(4096, o.max_num_seqs);
  cfg.batching = o.batching;
  cfg.threads = o.threads;
  cfg.kv_cache_mb = 64;
  cfg.http_port = 0;
  cfg.poll_ms = 20;
  ServiceHooks hooks;
  hooks.handle_signals = false;
  Service service(cfg, hooks);
  // The ZeroMQ ingress in front of the same database, wired as `moebatch serve` wires it: a
  // committed submit wakes the dispatcher at once instead of at its next poll.
  zmq_ingress::IngressOptions io_opts;
  io_opts.bind = "tcp://127.0.0.1:*";
  io_opts.store.path = db_path;
  io_opts.worker.on_committed = [&service](size_t) { service.wake(); };
  zmq_ingress::Ingress ingress(std::move(io_opts));
  out << fmt::format(
      "model   {} (random weights)\ndatabase {}\ningress {} (ZeroMQ ROUTER)\nhealth  "
      "http://127.0.0.1:{}/health and /metrics while it runs\n\n",
      model.string(), store_location_for_display(db_path), ingress.router_endpoint(),
      service.http_port());

  int service_code = 0;
  std::thread service_thread([&] { service_code = service.run(); });
  const auto t0 = std::chrono::steady_clock::now();
  int64_t sql_jobs = 0, zmq_jobs = 0, first_zmq = -1;
  ZmqTally zt;
  const auto stop_all = [&] {
    service.stop();
    service_thread.join();
    ingress.stop();
  };
  try {
    // Producers run while the service is already working: half via SQL, half via ZeroMQ, in
    // a few waves so the service picks up work as it arrives.
    StoreOptions so;
    so.path = db_path;
    JobStore store(so);
    ServiceDb producer_db(db_path);
    zmq_ingress::ClientOptions co;
    co.endpoint = ingress.router_endpoint();
    zmq_ingress::LazyPirateClient client(co);
    const int64_t waves = 4;
    for (int64_t w = 0; w < waves; ++w) {
      const int64_t lo = o.jobs * w / waves, hi = o.jobs * (w + 1) / waves;
      const int64_t half = (hi - lo) / 2;
      insert_with_sql(producer_db, lo, half, o.max_tokens);
      sql_jobs += half;
      // Messages of at most 25 jobs, each acked after its commit.
      for (const SubmitResult& r :
           client.submit_jobs(zmq_specs(lo + half, hi - lo - half, o.max_tokens), 25)) {
        zt.created += r.created ? 1 : 0;
      }
      if (first_zmq < 0 && hi - lo - half > 0) first_zmq = lo + half;
      zmq_jobs += hi - lo - half;
    }
    // A producer that lost an ack resends the same message: the keys map it to the same jobs.
    if (first_zmq >= 0) {
      for (const SubmitResult& r : client.submit_jobs(zmq_specs(first_zmq, 1, o.max_tokens), 25))
        zt.resent_known += r.created ? 0 : 1;
    }
    zt.sends = client.sends();
    out << fmt::format(
        "submitted {} jobs: {} by SQL INSERT (external producer), {} over ZeroMQ ({} "
        "messages, idempotency keys; a resent job came back as known: {})\n",
        o.jobs, sql_jobs, zmq_jobs, zt.sends, zt.resent_known == 1 ? "yes" : "NO");
    // Wait for every job to be final.
    for (;;) {
      const QueueStats st = store.stats();
      const int64_t open = st.counts.at(JobState::Queued) + st.counts.at(JobState::Running);
      if (open == 0) break;
      if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(10))
        throw Error("demo: jobs did not finish within 10 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (...) {
    stop_all();
    throw;
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop_all();

  StoreOptions so;
  so.path = db_path;
  JobStore store(so);
  const QueueStats st = store.stats();
  const LatencySamples l = ServiceDb(db_path).latency_samples();
  const int64_t sql_done = done_in_batch(store, "demo-sql");
  const int64_t zmq_done = done_in_batch(store, "demo-zmq");
  out << "\n";
  out << fmt::format("{:<26} {:>10} {:>10}\n", "submitted by", "jobs", "done");
  out << fmt::format("{:<26} {:>10} {:>10}\n", "  SQL INSERT", sql_jobs, sql_done);
  out << fmt::format("{:<26} {:>10} {:>10}\n\n", "  ZeroMQ (Lazy Pirate)", zmq_jobs, zmq_done);
  out << fmt::format("{:<26} {:>10}\n", "jobs done", st.counts.at(JobState::Done));
  out << fmt::format("{:<26} {:>10}\n", "jobs failed", st.counts.at(JobState::Failed));
  out << fmt::format("{:<26} {:>10}\n", "completion tokens", l.completion_tokens);
  out << fmt::format("{:<26} {:>10.1f}\n", "wall time (s)", wall_s);
  out << fmt::format("{:<26} {:>10.1f}\n", "tokens/s (generated)", l.completion_tokens / wall_s);
  out << fmt::format("{:<26} {:>10.1f}\n\n", "jobs/s", st.counts.at(JobState::Done) / wall_s);
  out << fmt::format("{:<18} {:>9} {:>9} {:>9}\n", "latency (ms)", "p50", "p95", "p99");
  out << fmt::format("{:<18} {:>9.0f} {:>9.0f} {:>9.0f}\n", "queue wait", pct(l.wait, 50),
                     pct(l.wait, 95), pct(l.wait, 99));
  out << fmt::format("{:<18} {:>9.0f} {:>9.0f} {:>9.0f}\n", "time to 1st token", pct(l.ttft, 50),
                     pct(l.ttft, 95), pct(l.ttft, 99));
  out << fmt::format("{:<18} {:>9.0f} {:>9.0f} {:>9.0f}\n", "total", pct(l.total, 50),
                     pct(l.total, 95), pct(l.total, 99));
  out << "\nsample outputs (random weights, so gibberish):\n";
  std::vector<Job> samples;
  for (const char* batch : {"demo-sql", "demo-zmq"}) {
    ListFilter f;
    f.state = JobState::Done;
    f.batch_id = batch;
    f.limit = 1;
    for (Job& j : store.list(f)) samples.push_back(std::move(j));
  }
  for (const Job& j : samples) {
    std::string text = j.result ? j.result->text : "";
    for (char& c : text)
      if (c == '\n') c = ' ';
    if (text.size() > 70) text = text.substr(0, 70) + "...";
    out << fmt::format("  job {:>4}: {}\n", j.id, text);
  }
  if (!dir.empty()) {
    if (o.keep) {
      out << "\nkept: " << db_path << " (try: moebatch stats --db " << db_path << ")\n";
    } else {
      std::filesystem::remove_all(dir);
    }
  }
  const bool all_done = st.counts.at(JobState::Done) == o.jobs && service_code == 0 &&
                        zt.created == zmq_jobs && zt.resent_known == (zmq_jobs > 0 ? 1 : 0);
  return all_done ? 0 : 1;
}

}  // namespace moebatch
