// The service while its job store refuses writes, in-process on the demo model: another
// connection holding the write lock past store_busy_timeout_ms, and a full disk (a VFS over the
// default one whose writes fail with SQLITE_FULL while the test says so: no root, no tmpfs).
// Either way finished results are kept and written once the store takes writes again (every
// job done exactly once, one attempt each), /health answers at once with 503 and a reason, and
// /metrics shows the store unwritable and the failed writes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "queue/job_store.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/wait.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

// ---- a disk that can be made full -------------------------------------------------------

// Whether writes fail now, and whether reads and locks fail too (a lost disk, an NFS mount
// gone). File scope because SQLite calls the VFS through plain function pointers; only this
// test file sets them.
std::atomic<bool> g_disk_full{false};
std::atomic<bool> g_disk_gone{false};
sqlite3_vfs* g_real_vfs = nullptr;

struct ShimFile {
  sqlite3_file base;  // pMethods: kShimMethods; the real file follows this struct
  sqlite3_file* real() { return reinterpret_cast<sqlite3_file*>(this + 1); }
};

sqlite3_file* real_of(sqlite3_file* f) { return reinterpret_cast<ShimFile*>(f)->real(); }

int shim_close(sqlite3_file* f) { return real_of(f)->pMethods->xClose(real_of(f)); }
int shim_read(sqlite3_file* f, void* b, int n, sqlite3_int64 off) {
  if (g_disk_gone) return SQLITE_IOERR_READ;
  return real_of(f)->pMethods->xRead(real_of(f), b, n, off);
}
int shim_write(sqlite3_file* f, const void* b, int n, sqlite3_int64 off) {
  if (g_disk_gone) return SQLITE_IOERR_WRITE;
  if (g_disk_full) return SQLITE_FULL;
  return real_of(f)->pMethods->xWrite(real_of(f), b, n, off);
}
int shim_truncate(sqlite3_file* f, sqlite3_int64 size) {
  return real_of(f)->pMethods->xTruncate(real_of(f), size);
}
int shim_sync(sqlite3_file* f, int flags) { return real_of(f)->pMethods->xSync(real_of(f), flags); }
int shim_file_size(sqlite3_file* f, sqlite3_int64* size) {
  return real_of(f)->pMethods->xFileSize(real_of(f), size);
}
int shim_lock(sqlite3_file* f, int l) {
  if (g_disk_gone) return SQLITE_IOERR_LOCK;
  return real_of(f)->pMethods->xLock(real_of(f), l);
}
int shim_unlock(sqlite3_file* f, int l) { return real_of(f)->pMethods->xUnlock(real_of(f), l); }
int shim_check_reserved(sqlite3_file* f, int* out) {
  return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out);
}
int shim_file_control(sqlite3_file* f, int op, void* arg) {
  return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
}
int shim_sector_size(sqlite3_file* f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); }
int shim_device_chars(sqlite3_file* f) {
  return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f));
}
int shim_shm_map(sqlite3_file* f, int pg, int sz, int extend, void volatile** out) {
  return real_of(f)->pMethods->xShmMap(real_of(f), pg, sz, extend, out);
}
int shim_shm_lock(sqlite3_file* f, int off, int n, int flags) {
  // Taking a WAL-index lock fails (every read transaction takes one); releasing one works.
  if (g_disk_gone && (flags & SQLITE_SHM_LOCK)) return SQLITE_IOERR_SHMLOCK;
  return real_of(f)->pMethods->xShmLock(real_of(f), off, n, flags);
}
void shim_shm_barrier(sqlite3_file* f) { real_of(f)->pMethods->xShmBarrier(real_of(f)); }
int shim_shm_unmap(sqlite3_file* f, int del) {
  return real_of(f)->pMethods->xShmUnmap(real_of(f), del);
}
int shim_fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
  return real_of(f)->pMethods->xFetch(real_of(f), off, n, out);
}
int shim_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return real_of(f)->pMethods->xUnfetch(real_of(f), off, p);
}

const sqlite3_io_methods kShimMethods = {3,
                                         shim_close,
                                         shim_read,
                                         shim_write,
                                         shim_truncate,
                                         shim_sync,
                                         shim_file_size,
                                         shim_lock,
                                         shim_unlock,
                                         shim_check_reserved,
                                         shim_file_control,
                                         shim_sector_size,
                                         shim_device_chars,
                                         shim_shm_map,
                                         shim_shm_lock,
                                         shim_shm_barrier,
                                         shim_shm_unmap,
                                         shim_fetch,
                                         shim_unfetch};

int shim_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags, int* out) {
  auto* f = reinterpret_cast<ShimFile*>(file);
  f->base.pMethods = nullptr;
  const int rc = g_real_vfs->xOpen(g_real_vfs, name, f->real(), flags, out);
  // The real file's methods are version 3 (unix); without them the open failed.
  if (f->real()->pMethods) f->base.pMethods = &kShimMethods;
  return rc;
}

/// Makes a "full disk" VFS the process default for the scope; connections opened meanwhile
/// use it. Writes fail with SQLITE_FULL while g_disk_full is set.
class FullDiskVfs {
 public:
  FullDiskVfs() {
    g_real_vfs = sqlite3_vfs_find(nullptr);
    vfs_ = *g_real_vfs;
    vfs_.zName = "moebatch-test-full-disk";
    vfs_.szOsFile = static_cast<int>(sizeof(ShimFile)) + g_real_vfs->szOsFile;
    vfs_.xOpen = shim_open;
    sqlite3_vfs_register(&vfs_, /*makeDflt=*/1);
  }
  ~FullDiskVfs() {
    g_disk_full = false;
    g_disk_gone = false;
    sqlite3_vfs_unregister(&vfs_);
    sqlite3_vfs_register(g_real_vfs, 1);
  }

 private:
  sqlite3_vfs vfs_{};
};

// ---- the service ------------------------------------------------------------------------

ServiceConfig outage_config(const std::filesystem::path& dir) {
  ServiceConfig c = test::demo_service_config(dir);
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 512;
  c.warmup_seqs = 1;
  c.store_busy_timeout_ms = 300;
  return c;
}

void submit_jobs(JobStore& store, int n, int64_t max_tokens) {
  std::vector<JobSpec> specs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    specs[i].prompt = "outage job " + std::to_string(i);
    specs[i].sampling.max_tokens = max_tokens;
    specs[i].sampling.temperature = 0;
  }
  store.submit_many(specs);
}

int64_t count(const std::filesystem::path& db, const std::string& where) {
  return test::query_i64(db, "SELECT count(*) FROM jobs WHERE " + where);
}

/// /health's status and how long it took to answer.
struct Timed {
  int status = -1;
  std::string body;
  std::chrono::milliseconds took{0};
};
Timed timed_health(int port) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [status, body] = test::http_get(port, "/health");
  return {
      status, body,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)};
}

/// While the store refuses writes (the caller keeps it so until this returns): the jobs finish
/// in the engine, their results stay pending, /health says so at once, /metrics shows the
/// outage. Polls until all of that was seen, for at most `limit` (the jobs' pace depends on the
/// machine's load).
void expect_outage_seen(int port, const std::filesystem::path& db, int jobs,
                        std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  bool saw_503 = false, saw_all_pending = false, saw_gauge_0 = false;
  double failures = 0;
  std::chrono::milliseconds slowest{0};
  while (std::chrono::steady_clock::now() < end &&
         !(saw_503 && saw_all_pending && saw_gauge_0 && failures > 0)) {
    const Timed h = timed_health(port);
    slowest = std::max(slowest, h.took);
    if (h.status == 503) {
      EXPECT_NE(h.body.find("\"status\":\"store_unwritable\""), std::string::npos) << h.body;
      EXPECT_NE(h.body.find("refuses writes"), std::string::npos) << h.body;
      saw_503 = true;
    }
    const std::string m = test::http_get(port, "/metrics").second;
    saw_all_pending |= test::metric_value(m, "moebatch_results_pending") == jobs;
    saw_gauge_0 |= test::metric_value(m, "moebatch_store_writable") == 0;
    failures = test::metric_value(m, "moebatch_store_write_failures_total");
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(saw_503) << "/health never reported the store unwritable";
  EXPECT_TRUE(saw_all_pending) << "the finished results were not all kept";
  EXPECT_TRUE(saw_gauge_0) << "moebatch_store_writable never went to 0";
  EXPECT_GT(failures, 0);
  // The io thread waits at most 200 ms for the lock in one call: /health never waits longer.
  EXPECT_LT(slowest, 700ms);
  // Nothing was written meanwhile: the jobs are still running under this service's lease.
  EXPECT_EQ(count(db, "state = 'running'"), jobs);
}

void expect_recovered(int port, const std::filesystem::path& db, int jobs) {
  ASSERT_TRUE(test::wait_until([&] { return count(db, "state = 'done'") == jobs; }, 5s))
      << "done " << count(db, "state = 'done'") << " of " << jobs;
  EXPECT_EQ(count(db, "attempts = 1"), jobs) << "a result was lost and its job ran again";
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM job_latency"), jobs);
  ASSERT_TRUE(test::wait_until([&] { return test::http_get(port, "/health").first == 200; }, 3s));
  const std::string m = test::http_get(port, "/metrics").second;
  EXPECT_EQ(test::metric_value(m, "moebatch_store_writable"), 1) << m;
  EXPECT_EQ(test::metric_value(m, "moebatch_results_pending"), 0) << m;
  EXPECT_EQ(test::metric_value(m, "moebatch_jobs_done_total"), jobs) << m;
}

// Jobs claimed and left running (the engine is busy with them) before the outage starts.
void start_jobs(JobStore& store, const std::filesystem::path& db, int jobs) {
  submit_jobs(store, jobs, 48);
  ASSERT_TRUE(test::wait_until([&] { return count(db, "state = 'running'") == jobs; }, 10s))
      << "running " << count(db, "state = 'running'");
}

// Intake resumed after an outage: two new jobs run beside the `done` ones.
void expect_intake_resumed(JobStore& store, const std::filesystem::path& db, int done,
                           std::chrono::seconds limit) {
  submit_jobs(store, 2, 4);
  EXPECT_TRUE(test::wait_until([&] { return count(db, "state = 'done'") == done + 2; }, limit))
      << "done " << count(db, "state = 'done'") << " of " << done + 2;
}

TEST(ServiceStoreOutage, LockedStoreKeepsResultsAndHealthAnswersAtOnce) {
  MB_SKIP_UNDER_TSAN("the running jobs must finish while the store is out");
  test::TempDir dir;
  const ServiceConfig cfg = outage_config(dir.path());
  test::RunningService run(cfg);
  JobStore store(test::store_options(cfg.db));
  constexpr int kJobs = 8;
  start_jobs(store, cfg.db, kJobs);
  {
    // Another writer holds the lock for far longer than store_busy_timeout_ms (300 ms).
    test::SqlConnection holder(cfg.db);
    ASSERT_EQ(holder.exec("BEGIN IMMEDIATE"), "");
    expect_outage_seen(run.port(), cfg.db, kJobs, 20s);
    ASSERT_EQ(holder.exec("ROLLBACK"), "");
  }
  expect_recovered(run.port(), cfg.db, kJobs);
  EXPECT_EQ(run.stop(), 0);
}

TEST(ServiceStoreOutage, FullDiskKeepsResultsAndIntakeResumesAfterwards) {
  MB_SKIP_UNDER_TSAN("the running jobs must finish while the store is out");
  FullDiskVfs vfs;  // before any connection opens: the service's use it too
  test::TempDir dir;
  const ServiceConfig cfg = outage_config(dir.path());
  {
    test::RunningService run(cfg);
    JobStore store(test::store_options(cfg.db));
    constexpr int kJobs = 8;
    start_jobs(store, cfg.db, kJobs);
    g_disk_full = true;
    expect_outage_seen(run.port(), cfg.db, kJobs, 20s);
    g_disk_full = false;
    expect_recovered(run.port(), cfg.db, kJobs);
    expect_intake_resumed(store, cfg.db, kJobs, 10s);
    EXPECT_EQ(run.stop(), 0);
  }
}

// A store that cannot even be read (data_version, lease checks, the final-event log) fails
// each io-thread step that needs it, never the daemon: a ZeroMQ submit's wake-up claims at once,
// outside the poll, and must survive it too. Once the disk is back every job finishes once.
TEST(ServiceStoreOutage, UnreadableStoreNeverEndsTheDaemon) {
  // Under TSan the demo model generates ~8 tokens/s: the 8 × 48 tokens outlast every bound.
  MB_SKIP_UNDER_TSAN("the running jobs must finish within the test's bounds");
  FullDiskVfs vfs;  // before any connection opens: the service's use it too
  test::TempDir dir;
  const ServiceConfig cfg = outage_config(dir.path());
  test::RunningService run(cfg);
  JobStore store(test::store_options(cfg.db));
  constexpr int kJobs = 8;
  start_jobs(store, cfg.db, kJobs);
  g_disk_gone = true;
  // Wake-ups and polls for a while, across the jobs' ends (their results cannot be written).
  for (int i = 0; i < 20; ++i) {
    run.svc.wake();
    std::this_thread::sleep_for(50ms);
  }
  const auto [status, body] = test::http_get(run.port(), "/health");
  EXPECT_NE(status, -1) << "the daemon stopped answering while the store was unreadable";
  g_disk_gone = false;
  ASSERT_TRUE(test::wait_until([&] { return count(cfg.db, "state = 'done'") == kJobs; }, 30s))
      << "done " << count(cfg.db, "state = 'done'") << " of " << kJobs;
  EXPECT_EQ(count(cfg.db, "attempts = 1"), kJobs) << "a result was lost and its job ran again";
  expect_intake_resumed(store, cfg.db, kJobs, 30s);
  EXPECT_EQ(run.stop(), 0);
}

}  // namespace
}  // namespace moebatch
