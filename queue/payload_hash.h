// The payload hash stored beside a job's client_key (jobs.payload_hash). A key names one request:
// submitting the same key again with the same payload is a retry and returns the existing job;
// with a different payload it is a conflict (KeyConflictError), never a silent reuse.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "queue/job.h"

namespace moebatch {

/// SHA-256 of bytes, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

/// SHA-256 over every field of spec except client_key, each length-prefixed so no two different
/// specs share an encoding. Doubles are hashed by their bits, as SQLite's REAL stores them.
/// Changing what goes in here makes stored hashes stale: bump the "job-payload-v1" tag and keep
/// the old encoding readable.
std::string job_payload_hash(const JobSpec& spec);

}  // namespace moebatch
