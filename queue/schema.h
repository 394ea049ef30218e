// The SQL text shipped with the library: the migrations of schemas/jobs.sql (SQLite) and
// schemas/jobs_pg.sql (PostgreSQL), and the external-producer example of
// schemas/example_external_insert.sql, embedded at build time so the binary never depends on
// the source tree at run time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moebatch {

/// One forward migration: running sql moves PRAGMA user_version from version-1 to version.
struct Migration {
  int version = 0;  ///< target user_version
  std::string sql;  ///< statements to run
};

/// Full text of schemas/jobs.sql (SQLite).
std::string_view jobs_schema_sql();
/// Full text of schemas/jobs_pg.sql (PostgreSQL).
std::string_view jobs_pg_schema_sql();
/// Full text of schemas/example_external_insert.sql.
std::string_view external_insert_example_sql();

/// Splits text on "-- @migration N" lines. Throws Error unless versions run 1, 2, 3, ... and
/// every block has SQL in it.
std::vector<Migration> parse_migrations(std::string_view text);

}  // namespace moebatch
