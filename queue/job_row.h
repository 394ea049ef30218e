// Mapping between jobs-table rows and the Job struct (internal to the queue module), for both
// store implementations. Reading is defensive: rows may come from external producers, so every
// column's type is checked and a mismatch is reported instead of being silently coerced (SQLite
// stores what it is given; PostgreSQL's typed columns make most of these checks pass trivially).
#pragma once

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
};

/// Decodes a row that selected kJobColumns.
JobRow decode_job_row(const RowSource& s);
/// decode_job_row of the current row of a SQLite statement.
JobRow read_job_row(const Stmt& s);

/// Why a claimed candidate must not run ("field: reason"): a type problem, an invalid spec or
/// attempts already at max_attempts; nullopt when it may run.
std::optional<std::string> claim_problem(const JobRow& row, const JobLimits& limits);

/// JSON array text for a stop list; nullopt (SQL NULL) when empty.
std::optional<std::string> stop_list_to_json(const std::vector<std::string>& stop);

}  // namespace moebatch
