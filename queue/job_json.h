// JSON views of jobs and queue stats, for `--json` CLI output and other machine consumers.
#pragma once

#include <nlohmann/json.hpp>

#include "queue/job.h"
#include "queue/job_store.h"

namespace moebatch {

/// Every field of a job; absent optionals are null.
nlohmann::json job_to_json(const Job& job);
/// Counts by state and latency percentiles.
nlohmann::json stats_to_json(const QueueStats& stats);

}  // namespace moebatch
