// JSON views of jobs and queue stats, for `--json` CLI output and other machine consumers.
#pragma once

#include <nlohmann/json.hpp>

#include "queue/job.h"
#include "queue/job_store.h"

namespace moebatch {

/// Every field of a job; absent optionals are null.
nlohmann::json job_to_json(const Job& job);
/// One batch's counts: {"batch_id","total","counts":{state: n},"prompt_tokens",
/// "completion_tokens","first_enqueued_at","last_finished_at"} (the ZeroMQ batch_* replies and
/// `moebatch batch status --json`).
nlohmann::json batch_counts_to_json(const std::string& batch_id, const BatchCounts& counts);
/// The inverse of batch_counts_to_json (a remote reply); throws Error on a malformed object.
BatchCounts batch_counts_from_json(const nlohmann::json& j);
/// A done job's latency record.
nlohmann::json latency_to_json(const LatencyRecord& l);
/// Counts by state, latency_window, and the latency percentiles over that window.
nlohmann::json stats_to_json(const QueueStats& stats);

}  // namespace moebatch
