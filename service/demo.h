// `moebatch demo`: the whole pipeline in under a minute on a 2-core machine. Starts the service
// in-process on the bundled random-weight model (CPU) with the ZeroMQ ingress in front of it (as
// `moebatch serve` runs it), submits half of the jobs through direct SQL INSERTs (an external
// producer) and half through the Lazy-Pirate ZeroMQ client (batched messages, idempotency keys,
// one message resent to show it creates nothing), waits for every job to reach a final state,
// stops the service gracefully, and prints a summary table: jobs per producer, jobs by state,
// tokens/s, and latency p50/p95/p99.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "service/config.h"

namespace moebatch {

/// Knobs of the demo.
struct DemoOptions {
  int64_t jobs = 300;                                ///< jobs to submit, 1..100000
  int64_t max_tokens = 16;                           ///< max_tokens of every job, 1..512
  int64_t max_num_seqs = 64;                         ///< batch slots
  BatchingMode batching = BatchingMode::Continuous;  ///< batching mode
  int threads = 0;                                   ///< CPU threads; 0 = all cores
  std::string db;                                    ///< database; empty = a temporary one
  bool keep = false;                                 ///< keep the temporary database
};

/// Runs the demo, printing to `out`; returns 0 when every job finished and the resent ZeroMQ
/// message created nothing, 1 otherwise.
int run_service_demo(const DemoOptions& opts, std::ostream& out);

}  // namespace moebatch
