// CLI commands of the queue module: submit, status, result, list, cancel, stats, export.
// Each opens the job database (--db, default common/paths.h default_db_path()), does one thing,
// and prints human text to stdout, or JSON with --json. Bad input throws InputError (exit 2);
// a job in the wrong state for the request throws Error (exit 1).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "common/paths.h"
#include "queue/job_json.h"
#include "queue/job_store.h"
#include "queue/job_validate.h"
#include "queue/openai_batch.h"
#include "queue/store_url.h"
#include "queue/zmq/client.h"

namespace moebatch::cli {
namespace {

using nlohmann::json;

/// Flags every queue command shares.
struct CommonFlags {
  std::string db;
  bool json = false;
};

void add_common(CLI::App* cmd, CommonFlags& f) {
  cmd->add_option("--db", f.db, "Job database (default $MOEBATCH_DB or the user data dir)");
  cmd->add_flag("--json", f.json, "Print JSON instead of text");
}

// --db: a SQLite file (its directory is created) or a postgresql:// URL; any other scheme is a
// usage error.
std::unique_ptr<JobStore> open_store(const CommonFlags& f) {
  const std::string db = f.db.empty() ? default_db_path().string() : f.db;
  StoreOptions o;
  o.path = prepare_store_location(db).target;
  return std::make_unique<JobStore>(o);
}

// Job fields come from producers: a key or an error text holding ESC [ ... could rewrite the
// operator's terminal. Text output shows C0/C1 controls, DEL and bytes that are not UTF-8 as
// \xNN (C1 as \u00NN) instead; everything else passes unchanged.
std::string printable(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto hex = [](std::string& out, const char* prefix, unsigned v) {
    out += prefix;
    out.push_back(kHex[(v >> 4) & 15]);
    out.push_back(kHex[v & 15]);
  };
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      hex(out, "\\x", c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size() || !is_valid_utf8(s.substr(i, len))) {
      hex(out, "\\x", c);
      ++i;
      continue;
    }
    if (c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {
      hex(out, "\\u00", static_cast<unsigned char>(s[i + 1]));  // C1 control, U+0080..U+009F
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

// CLI11 reads integers with strtoll in base 0: "99999999999999999999" became INT64_MAX and "010"
// octal 8. Integer flags and arguments are checked as plain decimal int64 first and handed on
// in canonical form; a failed check is a usage error (exit 2).
CLI::Validator decimal_int() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range) return "'" + s + "' is out of the 64-bit range";
        if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
          return "'" + s + "' is not a decimal integer";
        }
        s = std::to_string(v);  // canonical: CLI11 would read "010" as octal
        return "";
      },
      "INT");
}

// Results may hold arbitrary model bytes; never let a stray byte abort the output.
std::string dump(const json& j, int indent = -1) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string format_time(std::optional<int64_t> ms) {
  if (!ms) return "-";
  std::time_t secs = static_cast<std::time_t>(*ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return std::string(buf) + "." + fmt::format("{:03d}", static_cast<int>(*ms % 1000)) + "Z";
}

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled) : label_(std::move(label)), on_(enabled) {}
  ~ProgressBar() {
    if (drawn_) std::fputc('\n', stderr);
  }
  void update(size_t done, size_t total) {
    if (!on_ || total == 0) return;
    const int width = 40;
    const auto filled = static_cast<int>(width * std::min(done, total) / total);
    std::fprintf(stderr, "\r%s [%s%s] %zu/%zu", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total);
    drawn_ = true;
  }

 private:
  std::string label_;
  bool on_;
  bool drawn_ = false;
};

/// Options of `submit`.
struct SubmitFlags {
  CommonFlags common;
  std::string prompt, file, batch, key;
  bool chat = false, no_progress = false;
  JobSpec spec;
  std::optional<int64_t> seed;
  zmq_ingress::RemoteSubmitFlags remote;  ///< --endpoint: submit through the ZeroMQ ingress
};

void run_submit_file(SubmitFlags& f, JobStore& store) {
  std::filesystem::path path(f.file);
  std::string batch = f.batch.empty() ? path.stem().string() : f.batch;
  const bool bar = !f.no_progress && ::isatty(STDERR_FILENO);
  BatchFile parsed;
  {
    ProgressBar read_bar("reading ", bar);
    parsed = read_batch_file(path, batch, store.options().limits, BatchFileLimits{},
                             [&](size_t done, size_t total) { read_bar.update(done, total); });
  }
  // All or nothing: one bad line means nothing from the file is queued, so a fixed file can be
  // imported again without duplicates or gaps.
  if (!parsed.errors.empty()) {
    for (const std::string& e : parsed.errors) std::fprintf(stderr, "%s\n", e.c_str());
    throw InputError(std::to_string(parsed.errors.size()) + " bad line(s) in '" + f.file +
                     "'; nothing was imported (fix the file and submit it again)");
  }
  if (parsed.specs.empty()) throw InputError("'" + f.file + "' holds no requests");
  std::vector<SubmitResult> ids;
  {
    ProgressBar insert_bar("queueing", bar);
    ids = store.submit_many(parsed.specs,
                            [&](size_t done) { insert_bar.update(done, parsed.specs.size()); });
  }
  size_t created = 0;
  for (const auto& r : ids) created += r.created ? 1 : 0;
  if (f.common.json) {
    json out = {{"batch_id", batch},
                {"created", created},
                {"existing", ids.size() - created},
                {"ids", json::array()}};
    for (const auto& r : ids) out["ids"].push_back(r.id);
    std::cout << dump(out) << "\n";
  } else {
    std::cout << "batch " << batch << ": " << created << " job(s) queued";
    if (created != ids.size()) std::cout << ", " << ids.size() - created << " already present";
    if (!ids.empty()) std::cout << " (ids " << ids.front().id << ".." << ids.back().id << ")";
    std::cout << "\n";
  }
}

void run_submit(SubmitFlags& f) {
  if (f.prompt.empty() == f.file.empty()) {
    throw InputError("submit needs exactly one of a PROMPT argument or --file");
  }
  if (!f.remote.endpoint.empty() && !f.file.empty()) {
    throw InputError("--endpoint takes a PROMPT; import --file into the local database");
  }
  // With --endpoint the job goes to a remote ingress; no local database is opened.
  auto store = f.remote.endpoint.empty() ? open_store(f.common) : nullptr;
  if (!f.file.empty()) return run_submit_file(f, *store);
  JobSpec spec = f.spec;
  spec.sampling.seed = f.seed;
  if (!f.batch.empty()) spec.batch_id = f.batch;
  if (!f.key.empty()) spec.client_key = f.key;
  if (f.chat) {
    spec.prompt_kind = PromptKind::Chat;
    spec.prompt = json::array({{{"role", "user"}, {"content", f.prompt}}}).dump();
  } else {
    spec.prompt = f.prompt;
  }
  SubmitResult r = store ? store->submit(spec) : zmq_ingress::submit_remote(f.remote, spec);
  if (f.common.json) {
    std::cout << dump({{"id", r.id}, {"created", r.created}}) << "\n";
  } else {
    std::cout << (r.created ? "queued job " : "existing job ") << r.id << "\n";
  }
}

Job find_job(JobStore& store, int64_t id, const std::string& key) {
  std::optional<Job> j = key.empty() ? store.get(id) : store.get_by_key(key);
  if (!j)
    throw InputError(key.empty() ? "no job with id " + std::to_string(id)
                                 : "no job with key '" + key + "'");
  return *j;
}

void print_status(const Job& j) {
  std::cout << "job " << j.id << ": " << job_state_to_string(j.state) << "\n";
  auto row = [](const char* k, const std::string& v) {
    std::cout << fmt::format("  {:<12} {}\n", k, v);
  };
  if (j.spec.client_key) row("key", printable(*j.spec.client_key));
  if (j.spec.batch_id) row("batch", printable(*j.spec.batch_id));
  row("priority", std::to_string(j.spec.priority));
  row("attempts", std::to_string(j.attempts) + "/" + std::to_string(j.spec.max_attempts));
  row("enqueued", format_time(j.enqueued_at));
  if (j.started_at) row("started", format_time(j.started_at));
  if (j.finished_at) row("finished", format_time(j.finished_at));
  if (j.lease_owner) {
    row("lease", printable(*j.lease_owner) + " until " + format_time(j.lease_expires_at));
  }
  if (j.error) row("error", printable(*j.error));
  if (j.result) {
    row("tokens", std::to_string(j.result->prompt_tokens) + " prompt, " +
                      std::to_string(j.result->completion_tokens) + " completion");
  }
}

void print_stats(const QueueStats& st) {
  std::cout << fmt::format("{:<10} {:>10}\n", "state", "jobs");
  int64_t total = 0;
  for (const auto& [state, n] : st.counts) {
    std::cout << fmt::format("{:<10} {:>10}\n", job_state_to_string(state), n);
    total += n;
  }
  std::cout << fmt::format("{:<10} {:>10}\n\n", "total", total);
  std::cout << fmt::format("{:<14} {:>7} {:>10} {:>10} {:>10} {:>10}\n", "latency", "n", "p50",
                           "p90", "p99", "max");
  auto line = [](const char* name, const Percentiles& p) {
    std::cout << fmt::format("{:<14} {:>7} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", name,
                             p.count, p.p50, p.p90, p.p99, p.max);
  };
  line("queue wait ms", st.queue_wait_ms);
  line("ttft ms", st.ttft_ms);
  line("total ms", st.total_ms);
  line("tokens/s", st.tokens_per_s);
}

}  // namespace

void register_queue_commands(CLI::App& app) {
  // Flag storage must outlive parsing; the App owns it through these shared pointers.
  auto sf = std::make_shared<SubmitFlags>();
  auto* submit = app.add_subcommand("submit", "Queue a prompt, or an OpenAI Batch JSONL file");
  add_common(submit, sf->common);
  submit->add_option("prompt", sf->prompt, "Prompt text");
  submit->add_option("--file", sf->file,
                     "OpenAI Batch input JSONL (/v1/chat/completions, /v1/completions). "
                     "All or nothing: any bad line and nothing is queued");
  submit->add_option("--batch", sf->batch, "Batch id (default for --file: the file name stem)");
  submit->add_option("--key", sf->key, "Idempotency key: resubmitting it returns the same job");
  submit->add_flag("--chat", sf->chat, "Send the prompt as one user chat message");
  submit->add_option("--priority", sf->spec.priority, "Higher runs first (default 0)")
      ->transform(decimal_int());
  submit->add_option("--max-tokens", sf->spec.sampling.max_tokens, "Token budget (default 256)")
      ->transform(decimal_int());
  submit->add_option("--temperature", sf->spec.sampling.temperature, "0..2 (default 1)");
  submit->add_option("--top-p", sf->spec.sampling.top_p, "(0, 1] (default 1)");
  submit->add_option("--top-k", sf->spec.sampling.top_k, "0 disables (default 0)")
      ->transform(decimal_int());
  submit->add_option("--seed", sf->seed, "Sampling seed")->transform(decimal_int());
  submit->add_option("--stop", sf->spec.sampling.stop, "Stop string (repeatable)");
  submit->add_option("--max-attempts", sf->spec.max_attempts, "Attempts before failing (default 3)")
      ->transform(decimal_int());
  submit->add_flag("--no-progress", sf->no_progress, "Never draw the import progress bar");
  submit->add_option("--endpoint", sf->remote.endpoint,
                     "Submit through a ZeroMQ ingress (tcp://...), retrying Lazy-Pirate style");
  submit->add_option("--timeout-ms", sf->remote.timeout_ms, "--endpoint: wait per try (3000)")
      ->transform(decimal_int());
  submit->add_option("--attempts", sf->remote.attempts, "--endpoint: tries before giving up (4)")
      ->transform(decimal_int());
  submit->add_option("--curve-server-key", sf->remote.curve_server_key,
                     "--endpoint: server public key file (enables CURVE)");
  submit->add_option("--curve-secret", sf->remote.curve_secret,
                     "--endpoint: client secret key file (CURVE)");
  submit->callback([sf] { run_submit(*sf); });

  struct IdFlags {
    CommonFlags common;
    int64_t id = 0;
    std::string key;
  };
  auto st = std::make_shared<IdFlags>();
  auto* status = app.add_subcommand("status", "Show one job (by ID or --key)");
  add_common(status, st->common);
  status->add_option("id", st->id, "Job id")->transform(decimal_int());
  status->add_option("--key", st->key, "Client idempotency key");
  status->callback([st] {
    if ((st->id > 0) == !st->key.empty())
      throw InputError("status needs exactly one of ID or --key");
    auto store = open_store(st->common);
    Job j = find_job(*store, st->id, st->key);
    if (st->common.json) {
      std::cout << dump(job_to_json(j)) << "\n";
    } else {
      print_status(j);
    }
  });

  auto rs = std::make_shared<IdFlags>();
  auto* result = app.add_subcommand("result", "Print a finished job's output");
  add_common(result, rs->common);
  result->add_option("id", rs->id, "Job id")->required()->transform(decimal_int());
  result->callback([rs] {
    auto store = open_store(rs->common);
    Job j = find_job(*store, rs->id, "");
    if (rs->common.json) {
      std::cout << dump(job_to_json(j)) << "\n";
      if (j.state != JobState::Done) throw CLI::RuntimeError(1);
      return;
    }
    if (j.state != JobState::Done) {
      throw Error("job " + std::to_string(j.id) + " is " +
                  std::string(job_state_to_string(j.state)) + ": no result" +
                  (j.error ? " (" + *j.error + ")" : ""));
    }
    std::cout << j.result->text << "\n";
  });

  struct ListFlags {
    CommonFlags common;
    std::string state, batch;
    int64_t limit = 100, after = 0;
  };
  auto lf = std::make_shared<ListFlags>();
  auto* list = app.add_subcommand("list", "List jobs, oldest first");
  add_common(list, lf->common);
  list->add_option("--state", lf->state, "queued|running|done|failed|cancelled");
  list->add_option("--batch", lf->batch, "Only this batch id");
  list->add_option("--limit", lf->limit, "At most this many (default 100)")
      ->transform(decimal_int());
  list->add_option("--after", lf->after, "Only ids above this (paging)")->transform(decimal_int());
  list->callback([lf] {
    ListFilter filter;
    if (!lf->state.empty()) {
      filter.state = job_state_from_string(lf->state);
      if (!filter.state) throw InputError("--state: unknown state '" + lf->state + "'");
    }
    if (!lf->batch.empty()) filter.batch_id = lf->batch;
    filter.limit = lf->limit;
    filter.after_id = lf->after;
    auto store = open_store(lf->common);
    std::vector<Job> jobs = store->list(filter);
    if (lf->common.json) {
      json out = json::array();
      for (const Job& j : jobs) out.push_back(job_to_json(j));
      std::cout << dump(out) << "\n";
      return;
    }
    std::cout << fmt::format("{:>8}  {:<9} {:>5} {:>4}  {:<16} {:<24} {}\n", "id", "state", "prio",
                             "try", "batch", "key", "enqueued");
    for (const Job& j : jobs) {
      std::cout << fmt::format(
          "{:>8}  {:<9} {:>5} {:>4}  {:<16} {:<24} {}\n", j.id, job_state_to_string(j.state),
          j.spec.priority, j.attempts, printable(j.spec.batch_id.value_or("-")),
          printable(j.spec.client_key.value_or("-")), format_time(j.enqueued_at));
    }
  });

  auto cf = std::make_shared<IdFlags>();
  auto* cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
  add_common(cancel, cf->common);
  cancel->add_option("id", cf->id, "Job id")->required()->transform(decimal_int());
  cancel->callback([cf] {
    auto store = open_store(cf->common);
    bool ok = store->cancel(cf->id);
    Job j = find_job(*store, cf->id, "");
    if (cf->common.json) std::cout << dump({{"id", j.id}, {"cancelled", ok}}) << "\n";
    if (!ok) {
      throw Error("job " + std::to_string(j.id) + " is already " +
                  std::string(job_state_to_string(j.state)) + "; not cancelled");
    }
    if (!cf->common.json) std::cout << "cancelled job " << j.id << "\n";
  });

  auto sfl = std::make_shared<CommonFlags>();
  auto* stats = app.add_subcommand("stats", "Counts by state and latency percentiles");
  add_common(stats, *sfl);
  stats->callback([sfl] {
    auto store = open_store(*sfl);
    QueueStats s = store->stats();
    if (sfl->json) {
      std::cout << dump(stats_to_json(s)) << "\n";
    } else {
      print_stats(s);
    }
  });

  struct ExportFlags {
    CommonFlags common;
    std::string batch, output;
  };
  auto ef = std::make_shared<ExportFlags>();
  auto* exp =
      app.add_subcommand("export", "Write a batch's finished jobs as OpenAI Batch output JSONL");
  add_common(exp, ef->common);
  exp->add_option("--batch", ef->batch, "Batch id")->required();
  exp->add_option("--output,-o", ef->output, "Output file (default stdout)");
  exp->callback([ef] {
    auto store = open_store(ef->common);
    std::ofstream file;
    if (!ef->output.empty()) {
      file.open(ef->output, std::ios::binary | std::ios::trunc);
      if (!file) throw InputError("cannot write '" + ef->output + "'");
    }
    std::ostream& out = ef->output.empty() ? std::cout : file;
    ListFilter filter;
    filter.batch_id = ef->batch;
    filter.limit = 10000;
    size_t written = 0, pending = 0;
    for (;;) {
      std::vector<Job> page = store->list(filter);
      if (page.empty()) break;
      for (const Job& j : page) {
        if (!job_state_is_final(j.state)) {
          ++pending;
          continue;
        }
        out << dump(batch_output_line(j)) << "\n";
        ++written;
      }
      filter.after_id = page.back().id;
    }
    out.flush();
    if (!out) throw Error("writing the export failed");
    if (written + pending == 0) throw InputError("no jobs in batch '" + ef->batch + "'");
    spdlog::info("exported {} finished job(s) of batch {}; {} not finished yet", written, ef->batch,
                 pending);
  });
}

}  // namespace moebatch::cli
