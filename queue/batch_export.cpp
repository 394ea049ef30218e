#include "queue/batch_export.h"

#include <algorithm>

#include "common/error.h"
#include "common/json_parse.h"
#include "queue/job_store.h"
#include "queue/openai_batch.h"

namespace moebatch {

using nlohmann::json;

BatchExportPage batch_export_page(JobStore& store, const std::string& batch_id, int64_t after_id,
                                  int64_t limit, size_t max_bytes) {
  constexpr int64_t kRowsPerRead = 32;
  BatchExportPage page;
  size_t bytes = 0;
  int64_t seen = 0;
  ListFilter filter;
  filter.batch_id = batch_id;
  filter.after_id = after_id;
  while (seen < limit) {
    filter.limit = std::min(kRowsPerRead, limit - seen);
    const std::vector<Job> jobs = store.list(filter);
    for (const Job& j : jobs) {
      if (bytes > max_bytes) {
        page.more = true;
        return page;
      }
      page.last_id = j.id;
      ++seen;
      if (!job_state_is_final(j.state)) {
        ++page.unfinished;
        continue;
      }
      json line = batch_output_line(j);
      bytes += dump_json(line).size() + 1;
      page.lines.push_back({j.state == JobState::Done, std::move(line)});
    }
    if (static_cast<int64_t>(jobs.size()) < filter.limit) return page;  // the batch ends here
    filter.after_id = jobs.back().id;
  }
  page.more = true;
  return page;
}

BatchFiles batch_files(JobStore& store, const std::string& batch_id, size_t max_bytes) {
  constexpr int64_t kPageJobs = 1000;
  constexpr size_t kPageBytes = size_t{8} << 20;
  BatchFiles f;
  int64_t after_id = 0;
  while (true) {
    const BatchExportPage page =
        batch_export_page(store, batch_id, after_id, kPageJobs, kPageBytes);
    for (const BatchExportLine& l : page.lines)
      (l.done ? f.output : f.errors) += dump_json(l.line) + "\n";
    if (f.output.size() + f.errors.size() > max_bytes) {
      throw InputError("the batch's output passes " + std::to_string(max_bytes) +
                       " bytes (batch_output_max_mb); its results stay in the job table: "
                       "`moebatch export --batch " +
                       batch_id + "` writes them");
    }
    if (!page.more || !page.last_id) return f;
    after_id = *page.last_id;
  }
}

json batch_export_page_to_json(const BatchExportPage& page) {
  json lines = json::array();
  for (const BatchExportLine& l : page.lines) lines.push_back({{"done", l.done}, {"line", l.line}});
  return {{"lines", std::move(lines)},
          {"unfinished", page.unfinished},
          {"last_id", page.last_id ? json(*page.last_id) : json(nullptr)},
          {"more", page.more}};
}

BatchExportPage batch_export_page_from_json(const json& j) {
  auto bad = [](const char* what) { return Error(std::string("malformed export page: ") + what); };
  if (!j.is_object()) throw bad("not an object");
  BatchExportPage page;
  auto lines = j.find("lines");
  if (lines == j.end() || !lines->is_array()) throw bad("lines");
  for (const json& l : *lines) {
    if (!l.is_object() || !l.contains("done") || !l["done"].is_boolean() || !l.contains("line") ||
        !l["line"].is_object())
      throw bad("lines");
    page.lines.push_back({l["done"].get<bool>(), l["line"]});
  }
  auto unfinished = j.find("unfinished");
  if (unfinished == j.end() || !unfinished->is_number_integer() || unfinished->get<int64_t>() < 0)
    throw bad("unfinished");
  page.unfinished = unfinished->get<int64_t>();
  auto last = j.find("last_id");
  if (last == j.end() || !(last->is_null() || last->is_number_integer())) throw bad("last_id");
  if (!last->is_null()) page.last_id = last->get<int64_t>();
  auto more = j.find("more");
  if (more == j.end() || !more->is_boolean()) throw bad("more");
  page.more = more->get<bool>();
  // A page that says "more" must advance, or a client would ask for it forever.
  if (page.more && !page.last_id) throw bad("more without last_id");
  return page;
}

}  // namespace moebatch
