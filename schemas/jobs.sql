-- moebatch job queue schema, as an ordered list of forward migrations.
--
-- Each block starts with a line "-- @migration N" and moves the database from
-- PRAGMA user_version N-1 to N. JobStore runs the blocks above the file's current version, in
-- order, inside one BEGIN IMMEDIATE transaction each, and sets user_version at the end of each.
-- Never edit a block that has shipped: append a new one. See schemas/README.md for the contract
-- of producers that INSERT rows directly.
--
-- Times are integer milliseconds since the Unix epoch (UTC). The column default below computes
-- that from julianday('now') so plain-SQL producers need not supply it.

-- @migration 1
CREATE TABLE jobs (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  client_key        TEXT UNIQUE,              -- idempotency key; NULL = none
  batch_id          TEXT,                     -- group (e.g. one imported file)
  custom_id         TEXT,                     -- OpenAI Batch custom_id, echoed on export
  model             TEXT,                     -- model name the request asked for (informative)
  priority          INTEGER NOT NULL DEFAULT 0,   -- higher runs first
  prompt_kind       TEXT NOT NULL DEFAULT 'text', -- 'text' | 'chat'
  prompt            TEXT NOT NULL,            -- plain text, or a JSON array of chat messages
  max_tokens        INTEGER NOT NULL DEFAULT 256,
  temperature       REAL NOT NULL DEFAULT 1.0,
  top_p             REAL NOT NULL DEFAULT 1.0,
  top_k             INTEGER NOT NULL DEFAULT 0,   -- 0 = disabled
  seed              INTEGER,                  -- NULL = engine picks
  stop              TEXT,                     -- JSON array of strings; NULL = none
  state             TEXT NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  attempts          INTEGER NOT NULL DEFAULT 0,
  max_attempts      INTEGER NOT NULL DEFAULT 3,
  lease_owner       TEXT,
  lease_expires_at  INTEGER,
  error             TEXT,
  enqueued_at       INTEGER NOT NULL
                    DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
  started_at        INTEGER,
  first_token_at    INTEGER,
  finished_at       INTEGER,
  result_text       TEXT,
  prompt_tokens     INTEGER,
  completion_tokens INTEGER,
  finish_reason     TEXT
);
CREATE INDEX jobs_by_batch ON jobs (batch_id, id);

-- @migration 2
-- Retry backoff: a failed attempt sets not_before; claim skips rows whose time has not come.
ALTER TABLE jobs ADD COLUMN not_before INTEGER NOT NULL DEFAULT 0;
-- Claim order is priority then age; the partial index keeps the claim query off finished rows.
CREATE INDEX jobs_claim ON jobs (priority DESC, enqueued_at, id) WHERE state = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';
-- One latency record per finished job, written by complete() in the same transaction.
CREATE TABLE job_latency (
  job_id         INTEGER PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
  queue_wait_ms  INTEGER NOT NULL,  -- enqueued -> started (last attempt)
  ttft_ms        INTEGER,           -- started -> first token
  decode_ms      INTEGER,           -- first token -> last token
  total_ms       INTEGER NOT NULL,  -- enqueued -> finished
  tokens_per_s   REAL,              -- completion tokens / decode time
  recorded_at    INTEGER NOT NULL
);

-- @migration 3
-- Chat template variables of a chat job (OpenAI's chat_template_kwargs, e.g.
-- {"enable_thinking": false}): a JSON object, NULL = the template's defaults. Which keys a
-- template understands is checked by the service when it renders the prompt.
ALTER TABLE jobs ADD COLUMN chat_template_kwargs TEXT;

-- @migration 4
-- The OpenAI Files and Batch API. Uploaded request files and the output/error files a batch
-- writes are kept here, beside the jobs; a batch's requests are ordinary jobs with
-- jobs.batch_id = batches.id and client_key = '<batch id>/<custom_id>'. Times in seconds since
-- the epoch, as the API reports them.
CREATE TABLE files (
  id          TEXT PRIMARY KEY,          -- 'file-<hex>'
  purpose     TEXT NOT NULL,             -- 'batch' (uploaded) | 'batch_output' (written)
  filename    TEXT NOT NULL,
  bytes       INTEGER NOT NULL,
  created_at  INTEGER NOT NULL,
  content     TEXT NOT NULL
);
CREATE TABLE batches (
  id                 TEXT PRIMARY KEY,   -- 'batch_<hex>'
  input_file_id      TEXT NOT NULL,
  endpoint           TEXT NOT NULL,
  completion_window  TEXT NOT NULL,
  metadata           TEXT,               -- JSON object, NULL = none
  status             TEXT NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress',
                       'finalizing', 'completed', 'expired', 'cancelling', 'cancelled')),
  total              INTEGER NOT NULL DEFAULT 0,
  errors             TEXT,               -- JSON array of {code, message, line} when it failed
  output_file_id     TEXT,
  error_file_id      TEXT,
  created_at         INTEGER NOT NULL,
  in_progress_at     INTEGER,
  finalizing_at      INTEGER,
  completed_at       INTEGER,
  failed_at          INTEGER,
  cancelling_at      INTEGER,
  cancelled_at       INTEGER,
  expires_at         INTEGER
);
CREATE INDEX batches_open ON batches (status) WHERE status IN ('validating', 'in_progress',
  'cancelling');

-- @migration 5
-- jobs.id belongs to the service. A producer-chosen id, e.g. 9223372036854775807, would push
-- AUTOINCREMENT's counter to its end and make every later INSERT fail (SQLITE_FULL). In a BEFORE
-- INSERT trigger SQLite shows an id left to AUTOINCREMENT as -1 (NULL given explicitly reads the
-- same), so any other value was chosen by the producer; the AFTER trigger catches an explicit -1
-- or any other id below 1, which ids handed out by the service never are.
CREATE TRIGGER jobs_id_is_assigned BEFORE INSERT ON jobs
WHEN NEW.id IS NOT NULL AND NEW.id <> -1
BEGIN
  SELECT RAISE(ABORT, 'jobs.id is assigned by the queue: leave id out of the INSERT');
END;
CREATE TRIGGER jobs_id_is_positive AFTER INSERT ON jobs
WHEN NEW.id < 1
BEGIN
  SELECT RAISE(ABORT, 'jobs.id is assigned by the queue: leave id out of the INSERT');
END;
CREATE TRIGGER jobs_id_is_fixed BEFORE UPDATE OF id ON jobs
WHEN NEW.id IS NOT OLD.id
BEGIN
  SELECT RAISE(ABORT, 'jobs.id never changes');
END;

-- @migration 6
-- Idempotency keys name one request. payload_hash is the SHA-256 of the submitted job (every
-- field but the key; queue/payload_hash.h) written by the queue's own submits, so the same key
-- with a different payload is refused as a conflict instead of returning the old job. NULL for
-- rows inserted before this migration and by plain-SQL producers: the queue then hashes the
-- stored row when the key comes back.
ALTER TABLE jobs ADD COLUMN payload_hash TEXT;
-- Batch keys were '<batch_id>/<custom_id>', ambiguous once a batch id holds '/': batch 'x/y' +
-- custom_id 'z' and batch 'x' + custom_id 'y/z' gave the same key and the second job was lost.
-- The batch id is now escaped ('\' -> '\\', '/' -> '\/'; queue/openai_batch.h), which leaves
-- every key of a batch id without those two characters as it was; the others are rewritten here
-- so a re-import still finds them. A rewritten key that some other job already holds (only an
-- unrelated producer's key can) keeps its old spelling.
UPDATE OR IGNORE jobs
SET client_key = replace(replace(batch_id, '\', '\\'), '/', '\/') || '/' || custom_id
WHERE client_key = batch_id || '/' || custom_id
  AND (instr(batch_id, '/') > 0 OR instr(batch_id, '\') > 0);

-- @migration 7
-- Fencing token of a job's lease: every claim increments it, and every write a worker makes
-- under its lease (renew, complete, fail, release) is conditioned on the token it was given, as
-- well as on the worker id. A worker whose lease expired and was claimed again, even by a
-- process that reuses its worker id, finds no row to change.
ALTER TABLE jobs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;

-- @migration 8
-- OpenAI request fields the queue keeps but the engine does not use: `user` (the end user a
-- request is for; `user` is reserved in SQL, hence end_user) and `metadata` (a JSON object of
-- string values). Both are returned by status and export; NULL when the request had none.
ALTER TABLE jobs ADD COLUMN end_user TEXT;
ALTER TABLE jobs ADD COLUMN metadata TEXT;

-- @migration 9
-- Failed and cancelled jobs by state, for the queue's counts (JobStore::stats): queued and
-- running rows are counted through jobs_claim and jobs_running_lease, failed and cancelled ones
-- through this index, and done is every other row (count(*) reads the smallest index), so no
-- count reads the table's rows. Only rows in these two states have an entry.
CREATE INDEX jobs_failed_or_cancelled ON jobs (state) WHERE state IN ('failed', 'cancelled');

-- @migration 10
-- A file's content in pieces of at most 1 MiB (queue/batch_store.h, kFileChunkBytes), cut at
-- UTF-8 character boundaries, instead of one value: a download reads and sends one piece at a
-- time, so a 500 MB output file is neither held in memory whole nor read in one step of the
-- daemon's io thread, and no file is bounded by SQLite's ~1 GB limit on one value. Contents
-- written before this migration become one piece each. files is rebuilt without its content
-- column (ALTER TABLE ... DROP COLUMN needs SQLite 3.35), its rows in their rowid order, which
-- is the order files are listed in.
CREATE TABLE file_chunks (
  file_id  TEXT NOT NULL,
  seq      INTEGER NOT NULL,             -- 0, 1, ... in file order
  data     TEXT NOT NULL,
  PRIMARY KEY (file_id, seq)
);
INSERT INTO file_chunks (file_id, seq, data) SELECT id, 0, content FROM files WHERE content <> '';
CREATE TABLE files_v10 (
  id          TEXT PRIMARY KEY,          -- 'file-<hex>'
  purpose     TEXT NOT NULL,             -- 'batch' (uploaded) | 'batch_output' (written)
  filename    TEXT NOT NULL,
  bytes       INTEGER NOT NULL,
  created_at  INTEGER NOT NULL
);
INSERT INTO files_v10 (id, purpose, filename, bytes, created_at)
  SELECT id, purpose, filename, bytes, created_at FROM files ORDER BY rowid;
DROP TABLE files;
ALTER TABLE files_v10 RENAME TO files;
