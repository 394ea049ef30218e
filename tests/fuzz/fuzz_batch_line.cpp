// An OpenAI Batch input file as `moebatch submit --file` and the Files/Batch API read it
// (queue/openai_batch.*): every line is refused with an InputError naming it, or becomes a job
// the store's validation accepts, whose views (queue/job_json.*) and export line serialize
// without throwing and parse back as JSON.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "queue/job_json.h"
#include "queue/openai_batch.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;

// Strict: a validated job holds valid UTF-8 only, so nothing needs replacing.
void dump_and_parse(const json& j) {
  if (json::parse(j.dump(), nullptr, false).is_discarded()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const moebatch::JobLimits limits;
  moebatch::BatchFileLimits file_limits;
  file_limits.max_line_bytes = 64 << 10;
  const auto path = moebatch::fuzz::write_input(data, size, ".jsonl");
  moebatch::BatchFile file;
  try {
    // A batch id with both characters batch_client_key escapes.
    file = moebatch::read_batch_file(path, "in/put\\1", limits, file_limits);
  } catch (const moebatch::InputError&) {
    return 0;
  }
  int64_t id = 1;
  for (const moebatch::JobSpec& spec : file.specs) {
    if (moebatch::find_job_spec_error(spec, limits)) __builtin_trap();
    moebatch::Job job;
    job.id = id++;
    job.spec = spec;
    dump_and_parse(moebatch::job_to_json(job));
    job.state = moebatch::JobState::Done;
    job.finished_at = 1764547200000;
    job.result = moebatch::JobResult{spec.prompt, 3, 2, "length", std::nullopt};
    dump_and_parse(moebatch::job_to_json(job));
    dump_and_parse(moebatch::batch_output_line(job));
    job.state = moebatch::JobState::Failed;
    job.result.reset();
    job.error = "prompt: renders to no tokens";
    dump_and_parse(moebatch::batch_output_line(job));
  }
  return 0;
}
