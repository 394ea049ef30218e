#include "queue/batch_export.h"

#include "common/error.h"
#include "queue/job_store.h"
#include "queue/openai_batch.h"

namespace moebatch {

using nlohmann::json;

BatchExportPage batch_export_page(JobStore& store, const std::string& batch_id, int64_t after_id,
                                  int64_t limit, size_t max_bytes) {
  ListFilter filter;
  filter.batch_id = batch_id;
  filter.after_id = after_id;
  filter.limit = limit;
  const std::vector<Job> jobs = store.list(filter);
  BatchExportPage page;
  page.more = static_cast<int64_t>(jobs.size()) == limit;
  size_t bytes = 0;
  for (const Job& j : jobs) {
    if (bytes > max_bytes) {
      page.more = true;
      break;
    }
    page.last_id = j.id;
    if (!job_state_is_final(j.state)) {
      ++page.unfinished;
      continue;
    }
    json line = batch_output_line(j);
    bytes += line.dump(-1, ' ', false, json::error_handler_t::replace).size() + 1;
    (j.state == JobState::Done ? page.output : page.errors).push_back(std::move(line));
  }
  return page;
}

json batch_export_page_to_json(const BatchExportPage& page) {
  return {{"output", page.output},
          {"errors", page.errors},
          {"unfinished", page.unfinished},
          {"last_id", page.last_id ? json(*page.last_id) : json(nullptr)},
          {"more", page.more}};
}

BatchExportPage batch_export_page_from_json(const json& j) {
  auto bad = [](const char* what) { return Error(std::string("malformed export page: ") + what); };
  if (!j.is_object()) throw bad("not an object");
  BatchExportPage page;
  for (const char* key : {"output", "errors"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) throw bad(key);
    for (const json& line : *it) {
      if (!line.is_object()) throw bad(key);
      (key[0] == 'o' ? page.output : page.errors).push_back(line);
    }
  }
  auto unfinished = j.find("unfinished");
  if (unfinished == j.end() || !unfinished->is_number_integer()) throw bad("unfinished");
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
