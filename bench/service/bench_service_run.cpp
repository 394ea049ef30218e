// The service side of bench_service: a temporary database, jobs inserted in one transaction,
// the Service on a thread, timed until every job is done.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "queue/job_store.h"
#include "service/service.h"

namespace moebatch {

double run_through_service(const std::filesystem::path& model,
                           const std::vector<std::string>& prompts, int64_t max_tokens,
                           int64_t slots, int64_t* tokens_out) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "mb-bench-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  const std::filesystem::path dir = tmpl;
  ServiceConfig cfg;
  cfg.db = (dir / "jobs.db").string();
  cfg.model = model.string();
  cfg.max_num_seqs = slots;
  cfg.kv_cache_mb = 64;
  cfg.http_port = -1;
  cfg.poll_ms = 10;
  ServiceHooks hooks;
  hooks.handle_signals = false;
  Service svc(cfg, hooks);
  StoreOptions so;
  so.path = cfg.db;
  JobStore store(so);
  std::vector<JobSpec> specs;
  for (const auto& p : prompts) {
    JobSpec s;
    s.prompt = p;
    s.sampling.max_tokens = max_tokens;
    s.sampling.temperature = 0;
    specs.push_back(std::move(s));
  }
  int code = 0;
  std::thread t([&] { code = svc.run(); });
  const auto t0 = std::chrono::steady_clock::now();
  store.submit_many(specs);
  svc.wake();
  const auto n = static_cast<int64_t>(prompts.size());
  while (store.stats().counts.at(JobState::Done) < n)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  svc.stop();
  t.join();
  int64_t tokens = 0;
  ListFilter f;
  f.limit = 100000;
  for (const Job& j : store.list(f)) tokens += j.result ? j.result->completion_tokens : 0;
  *tokens_out = tokens;
  std::filesystem::remove_all(dir);
  return s;
}

}  // namespace moebatch
