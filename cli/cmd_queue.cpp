// CLI commands of the queue module: submit, status, result, list, cancel, stats (the batch
// verbs and export are in cmd_batch.cpp). Each opens the job database (--db, default
// common/paths.h default_db_path()), does one thing, and prints human text to stdout, or JSON
// with --json. Bad input throws InputError (exit 2); a job in the wrong state for the request
// throws Error (exit 1).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/queue_cli.h"
#include "common/error.h"
#include "common/json_parse.h"
#include "queue/job_json.h"
#include "queue/job_store.h"
#include "queue/job_validate.h"
#include "queue/openai_batch.h"
#include "queue/zmq/client.h"

namespace moebatch::cli {
namespace {

using nlohmann::json;

/// Options of `submit`.
struct SubmitFlags {
  CommonFlags common;
  std::string prompt, file, batch, key, error_file;
  bool chat = false, no_progress = false, strict = false;
  JobSpec spec;
  std::optional<int64_t> seed;
  zmq_ingress::RemoteSubmitFlags remote;  ///< --endpoint: submit through the ZeroMQ ingress
};

// Where a forgiving import reports its bad lines: --error-file, else beside the input
// (requests.jsonl -> requests.errors.jsonl).
std::filesystem::path error_file_path(const SubmitFlags& f) {
  if (!f.error_file.empty()) return f.error_file;
  std::filesystem::path p(f.file);
  return p.parent_path() / (p.stem().string() + ".errors.jsonl");
}

void write_error_file(const std::filesystem::path& path,
                      const std::vector<BatchLineError>& errors) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError("cannot write the error file '" + path.string() + "'");
  for (const BatchLineError& e : errors) out << dump_json(batch_error_line(e)) << "\n";
  out.flush();
  if (!out) throw Error("writing the error file '" + path.string() + "' failed");
}

// Local import. Without --strict a key conflict (a line whose request changed since an earlier
// import of the batch) rejects that line only: it joins the bad lines and the rest is
// submitted again (the failed transaction wrote nothing).
std::vector<SubmitResult> import_local(JobStore& store, BatchFile& parsed, bool strict,
                                       ProgressBar& bar) {
  for (;;) {
    try {
      return store.submit_many(parsed.specs,
                               [&](size_t done) { bar.update(done, parsed.specs.size()); });
    } catch (const KeyConflictError& e) {
      if (strict) throw;
      const size_t i = e.index();
      parsed.errors.push_back({parsed.spec_lines[i], "custom_id",
                               "the request differs from the one imported before as job " +
                                   std::to_string(e.existing_id()),
                               parsed.specs[i].custom_id});
      std::fprintf(stderr, "%s\n", printable(parsed.errors.back().text()).c_str());
      parsed.specs.erase(parsed.specs.begin() + static_cast<std::ptrdiff_t>(i));
      parsed.spec_lines.erase(parsed.spec_lines.begin() + static_cast<std::ptrdiff_t>(i));
      if (parsed.specs.empty()) return {};
    }
  }
}

void run_submit_file(SubmitFlags& f, JobStore* store) {
  std::filesystem::path path(f.file);
  std::string batch = f.batch.empty() ? path.stem().string() : f.batch;
  const bool bar = progress_wanted(f.no_progress);
  BatchFileLimits file_limits;
  // Forgiving imports report every bad line; strict ones stop after max_errors, as nothing
  // will be imported anyway.
  if (!f.strict) file_limits.max_errors = file_limits.max_lines + 1;
  BatchFile parsed;
  {
    ProgressBar read_bar("reading ", bar);
    parsed =
        read_batch_file(path, batch, store ? store->options().limits : JobLimits{}, file_limits,
                        [&](size_t done, size_t total) { read_bar.update(done, total); });
  }
  const size_t shown = std::min<size_t>(parsed.errors.size(), 20);
  for (size_t i = 0; i < shown; ++i) {
    std::fprintf(stderr, "%s:%s\n", printable(f.file).c_str(),
                 printable(parsed.errors[i].text()).c_str());
  }
  if (parsed.errors.size() > shown) {
    std::fprintf(stderr, "... and %zu more\n", parsed.errors.size() - shown);
  }
  // --strict: all or nothing, so a fixed file can be imported again without duplicates or gaps.
  if (f.strict && !parsed.errors.empty()) {
    throw InputError(std::to_string(parsed.errors.size()) + (parsed.stopped_early ? "+" : "") +
                     " bad line(s) in '" + f.file +
                     "'; nothing was imported (--strict; fix the file and submit it again)");
  }
  if (parsed.specs.empty() && parsed.errors.empty()) {
    throw InputError("'" + f.file + "' holds no requests");
  }
  std::vector<SubmitResult> ids;
  {
    ProgressBar insert_bar("queueing", bar);
    if (store) {
      ids = import_local(*store, parsed, f.strict, insert_bar);
    } else if (!parsed.specs.empty()) {
      zmq_ingress::LazyPirateClient client(zmq_ingress::client_options_from(f.remote));
      client.on_progress([&](size_t done) { insert_bar.update(done, parsed.specs.size()); });
      ids = client.submit_jobs(parsed.specs);
    }
  }
  std::optional<std::filesystem::path> error_file;
  if (!parsed.errors.empty()) {
    // Key conflicts were found after the parse errors; the file lists them in line order.
    std::stable_sort(
        parsed.errors.begin(), parsed.errors.end(),
        [](const BatchLineError& a, const BatchLineError& b) { return a.line < b.line; });
    error_file = error_file_path(f);
    write_error_file(*error_file, parsed.errors);
  }
  size_t created = 0;
  for (const auto& r : ids) created += r.created ? 1 : 0;
  if (f.common.json) {
    json out = {{"batch_id", batch},
                {"created", created},
                {"existing", ids.size() - created},
                {"rejected", parsed.errors.size()},
                {"error_file", error_file ? json(error_file->string()) : json(nullptr)},
                {"ids", json::array()}};
    for (const auto& r : ids) out["ids"].push_back(r.id);
    std::cout << dump_json(out) << "\n";
  } else {
    std::cout << "batch " << printable(batch) << ": " << created << " job(s) queued";
    if (created != ids.size()) std::cout << ", " << ids.size() - created << " already present";
    if (!ids.empty()) std::cout << " (ids " << ids.front().id << ".." << ids.back().id << ")";
    if (error_file) {
      std::cout << "; " << parsed.errors.size() << " line(s) rejected, see "
                << printable(error_file->string());
    }
    std::cout << "\n";
  }
  if (ids.empty()) throw InputError("no line of '" + f.file + "' could be imported");
  if (!parsed.errors.empty()) throw CLI::RuntimeError(1);  // imported, but not everything
}

void run_submit(SubmitFlags& f) {
  if (f.prompt.empty() == f.file.empty()) {
    throw InputError("submit needs exactly one of a PROMPT argument or --file");
  }
  if (f.file.empty() && (f.strict || !f.error_file.empty())) {
    throw InputError("--strict and --error-file go with --file");
  }
  // With --endpoint the jobs go to a remote ingress; no local database is opened.
  auto store = f.remote.endpoint.empty() ? open_store(f.common) : nullptr;
  if (!f.file.empty()) return run_submit_file(f, store.get());
  JobSpec spec = f.spec;
  spec.sampling.seed = f.seed;
  if (!f.batch.empty()) spec.batch_id = f.batch;
  if (!f.key.empty()) spec.client_key = f.key;
  if (f.chat) {
    spec.prompt_kind = PromptKind::Chat;
    if (!is_valid_utf8(f.prompt)) throw InputError("the prompt is not valid UTF-8");
    spec.prompt = json::array({{{"role", "user"}, {"content", f.prompt}}}).dump();
  } else {
    spec.prompt = f.prompt;
  }
  SubmitResult r = store ? store->submit(spec) : zmq_ingress::submit_remote(f.remote, spec);
  if (f.common.json) {
    std::cout << dump_json({{"id", r.id}, {"created", r.created}}) << "\n";
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

void print_status(const Job& j, const std::optional<LatencyRecord>& latency) {
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
  if (latency) {
    auto ms = [](std::optional<int64_t> v) { return v ? std::to_string(*v) + " ms" : "-"; };
    row("queue wait", ms(latency->queue_wait_ms));
    row("ttft", ms(latency->ttft_ms));
    row("decode", ms(latency->decode_ms));
    row("total", ms(latency->total_ms));
    row("tokens/s", latency->tokens_per_s ? fmt::format("{:.1f}", *latency->tokens_per_s) : "-");
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
  std::cout << fmt::format("latency of the newest {} done jobs (highest ids)\n",
                           st.latency_window);
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
                     "OpenAI Batch input JSONL (/v1/chat/completions, /v1/completions). Bad "
                     "lines are rejected one by one (exit 1) into --error-file");
  submit->add_flag("--strict", sf->strict,
                   "--file: all or nothing; any bad line and nothing is queued (exit 2)");
  submit->add_option("--error-file", sf->error_file,
                     "--file: where rejected lines go, as OpenAI error lines (default: "
                     "beside the input, NAME.errors.jsonl)");
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
  add_remote(submit, sf->remote);
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
    const std::optional<LatencyRecord> latency = store->latency(j.id);
    if (st->common.json) {
      json out = job_to_json(j);
      out["latency"] = latency ? latency_to_json(*latency) : json(nullptr);
      std::cout << dump_json(out) << "\n";
    } else {
      print_status(j, latency);
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
      std::cout << dump_json(job_to_json(j)) << "\n";
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
    bool all = false;
  };
  auto lf = std::make_shared<ListFlags>();
  auto* list = app.add_subcommand("list", "List jobs, oldest first");
  add_common(list, lf->common);
  list->add_option("--state", lf->state, "queued|running|done|failed|cancelled");
  list->add_option("--batch", lf->batch, "Only this batch id");
  list->add_option("--limit", lf->limit, "At most this many per page (default 100)")
      ->transform(decimal_int());
  list->add_option("--after", lf->after, "Only ids above this (the next page)")
      ->transform(decimal_int());
  list->add_flag("--all", lf->all, "Every page, not just the first --limit rows");
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
    // Pages are read one at a time and printed as they come, so --all holds one page in memory;
    // with --json the array is written element by element (the same text as one dump).
    bool first_row = true;
    if (lf->common.json) std::cout << "[";
    if (!lf->common.json) {
      std::cout << fmt::format("{:>8}  {:<9} {:>5} {:>4}  {:<16} {:<24} {}\n", "id", "state",
                               "prio", "try", "batch", "key", "enqueued");
    }
    for (;;) {
      std::vector<Job> jobs = store->list(filter);
      for (const Job& j : jobs) {
        if (lf->common.json) {
          std::cout << (first_row ? "" : ",") << dump_json(job_to_json(j));
          first_row = false;
          continue;
        }
        std::cout << fmt::format(
            "{:>8}  {:<9} {:>5} {:>4}  {:<16} {:<24} {}\n", j.id, job_state_to_string(j.state),
            j.spec.priority, j.attempts, printable(j.spec.batch_id.value_or("-")),
            printable(j.spec.client_key.value_or("-")), format_time(j.enqueued_at));
      }
      if (static_cast<int64_t>(jobs.size()) < filter.limit) break;
      filter.after_id = jobs.back().id;
      if (!lf->all) {
        // A full page: there may be more. Say how to get them, off stdout.
        std::fprintf(stderr, "(%lld rows shown; next page: --after %lld, or --all)\n",
                     static_cast<long long>(jobs.size()), static_cast<long long>(filter.after_id));
        break;
      }
    }
    if (lf->common.json) std::cout << "]\n";
  });

  auto cf = std::make_shared<IdFlags>();
  auto* cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
  add_common(cancel, cf->common);
  cancel->add_option("id", cf->id, "Job id")->required()->transform(decimal_int());
  cancel->callback([cf] {
    auto store = open_store(cf->common);
    bool ok = store->cancel(cf->id);
    Job j = find_job(*store, cf->id, "");
    if (cf->common.json) std::cout << dump_json({{"id", j.id}, {"cancelled", ok}}) << "\n";
    if (!ok) {
      throw Error("job " + std::to_string(j.id) + " is already " +
                  std::string(job_state_to_string(j.state)) + "; not cancelled");
    }
    if (!cf->common.json) std::cout << "cancelled job " << j.id << "\n";
  });

  auto sfl = std::make_shared<CommonFlags>();
  auto* stats = app.add_subcommand(
      "stats", "Counts by state, and latency percentiles of the newest done jobs");
  add_common(stats, *sfl);
  stats->callback([sfl] {
    auto store = open_store(*sfl);
    QueueStats s = store->stats();
    if (sfl->json) {
      std::cout << dump_json(stats_to_json(s)) << "\n";
    } else {
      print_stats(s);
    }
  });
}

}  // namespace moebatch::cli
