// Mapping between jobs-table rows and the Job struct (internal to the queue module). Reading is
// defensive: rows may come from external producers, so every column's storage type is checked
// and a mismatch is reported instead of being silently coerced.
#pragma once

#include <optional>
#include <string>

#include "queue/job.h"
#include "queue/sqlite_db.h"

namespace moebatch {

/// SELECT list matching read_job_row's column order.
extern const char* const kJobColumns;

/// A row as read: the job (best effort) and the first type problem, if any.
struct JobRow {
  Job job;                           ///< decoded fields
  std::optional<std::string> error;  ///< "column: reason" for the first unusable column
};

/// Decodes the current row of a statement that selected kJobColumns.
JobRow read_job_row(const Stmt& s);

/// JSON array text for a stop list; nullopt (SQL NULL) when empty.
std::optional<std::string> stop_list_to_json(const std::vector<std::string>& stop);

}  // namespace moebatch
