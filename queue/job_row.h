// Mapping between jobs-table rows and the Job struct (internal to the queue module), for both
// store implementations. Reading is defensive: rows may come from external producers, so every
// column's type is checked and a mismatch is reported instead of being silently coerced (SQLite
// stores what it is given; PostgreSQL's typed columns make most of these checks pass trivially).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "queue/job.h"
#include "queue/job_validate.h"
#include "queue/sqlite_db.h"

namespace moebatch {

/// SELECT list matching read_job_row's column order.
extern const char* const kJobColumns;

/// A row as read: the job (best effort) and the first type problem, if any.
struct JobRow {
  Job job;                           ///< decoded fields
  std::optional<std::string> error;  ///< "column: reason" for the first unusable column
};

/// One row's columns as the decoder sees them, whichever database produced it.
class RowSource {
 public:
  /// A column's value type (SQLite storage classes; PostgreSQL maps its column types on them).
  enum class Type { Null, Integer, Real, Text, Other };
  virtual ~RowSource() = default;
  virtual Type type(int col) const = 0;
  virtual int64_t i64(int col) const = 0;
  virtual double f64(int col) const = 0;
  virtual std::string text(int col) const = 0;
  /// Bytes of a text value, read without copying it (checked against the limits before text()).
  virtual size_t text_bytes(int col) const = 0;
};

/// Decodes a row that selected kJobColumns. The spec's text columns are measured before they are
/// copied: one longer than `limits` allow (an id over max_id_bytes, a prompt over
/// max_prompt_bytes, a stop list over stored_stop_max_bytes, ...) is not read, and its column is
/// the row's error, so a huge row costs neither the copy nor the parse of its JSON.
JobRow decode_job_row(const RowSource& s, const JobLimits& limits);
/// decode_job_row of the current row of a SQLite statement.
JobRow read_job_row(const Stmt& s, const JobLimits& limits);

/// The longest stored stop list (JSON text) read from a row: limits.max_stop strings of
/// max_stop_bytes, every byte written as a six-byte JSON escape, with quotes, commas and a few
/// spaces (about 12 KB at the defaults).
size_t stored_stop_max_bytes(const JobLimits& limits);
/// The longest stored metadata (JSON text) read from a row: find_metadata_error's 16 pairs of a
/// 64-byte key and a 512-byte value, written the same way (about 56 KB).
size_t stored_metadata_max_bytes();

/// Why a claimed candidate must not run ("field: reason"): a type problem, an invalid spec or
/// attempts already at max_attempts; nullopt when it may run.
std::optional<std::string> claim_problem(const JobRow& row, const JobLimits& limits);

/// JSON array text for a stop list; nullopt (SQL NULL) when empty.
std::optional<std::string> stop_list_to_json(const std::vector<std::string>& stop);

}  // namespace moebatch
