// --db values: SQLite paths, postgresql:// URLs, and the schemes that must be refused instead of
// becoming a SQLite file under a directory named after them.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "queue/job_store.h"
#include "queue/store_url.h"
#include "tests/common/files.h"

namespace moebatch {
namespace {

TEST(StoreUrl, PathsAreSqliteAndPostgresUrlsArePostgres) {
  EXPECT_EQ(parse_store_location("jobs.db").kind, StoreKind::Sqlite);
  EXPECT_EQ(parse_store_location("/var/lib/moebatch/jobs.db").target, "/var/lib/moebatch/jobs.db");
  EXPECT_EQ(parse_store_location("dir:with:colons/jobs.db").kind, StoreKind::Sqlite);
  EXPECT_EQ(parse_store_location("./a://b").kind, StoreKind::Sqlite);  // not a scheme
  for (const char* url :
       {"postgresql://u@db.example:5432/jobs", "postgres://u@h/jobs", "PostgreSQL://u@h/jobs",
        "postgresql:///jobs?host=/tmp/s", "postgresql://u@h?dbname=jobs"}) {
    const StoreLocation loc = parse_store_location(url);
    EXPECT_EQ(loc.kind, StoreKind::Postgres) << url;
    EXPECT_EQ(loc.target, url);
  }
}

TEST(StoreUrl, UnsupportedSchemesAndUrlsWithoutADatabaseAreErrors) {
  for (const char* bad : {"mysql://u@h/jobs", "sqlite://jobs.db", "file://jobs.db", "http://h/x",
                          "postgresq://u@h/jobs"}) {
    try {
      parse_store_location(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("unsupported scheme"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_store_location(""), InputError);
  EXPECT_THROW(parse_store_location("postgresql://u@h:5432"), InputError);
  EXPECT_THROW(parse_store_location("postgresql://u@h:5432/"), InputError);
}

TEST(StoreUrl, PasswordsAreHiddenInMessages) {
  EXPECT_EQ(store_location_for_display("postgresql://u:s3cret@h:5432/jobs"),
            "postgresql://u:***@h:5432/jobs");
  EXPECT_EQ(store_location_for_display("postgresql://u@h/jobs?password=s3cret&sslmode=require"),
            "postgresql://u@h/jobs?password=***&sslmode=require");
  EXPECT_EQ(store_location_for_display("/tmp/jobs.db"), "/tmp/jobs.db");
  try {
    parse_store_location("postgresql://u:s3cret@h:5432");
    ADD_FAILURE() << "accepted a URL without a database";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
}

TEST(StoreUrl, AnUnsupportedSchemeCreatesNothing) {
  test::TempDir dir;
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  StoreOptions o;
  o.path = "mysql://u@h/jobs";
  EXPECT_THROW(JobStore{o}, InputError);
  EXPECT_THROW(prepare_store_location("mysql://u@h/jobs"), InputError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  std::filesystem::current_path(cwd);
  // A SQLite path gets its directory.
  EXPECT_EQ(prepare_store_location((dir.path() / "a" / "b" / "jobs.db").string()).kind,
            StoreKind::Sqlite);
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "a" / "b"));
}

}  // namespace
}  // namespace moebatch
