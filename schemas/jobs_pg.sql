-- moebatch job queue schema for PostgreSQL, as an ordered list of forward migrations.
--
-- The same queue as schemas/jobs.sql (SQLite) with the same columns, names and meaning, so the
-- producer contract (schemas/README.md) and every reader are shared. Each block starts with a
-- line "-- @migration N"; the store runs the blocks above moebatch_schema.version in order, each
-- in its own transaction holding an advisory lock, so several hosts opening an old database at
-- once migrate it once. Block 1 is the SQLite schema as of its migration 7. Never edit a block
-- that has shipped: append a new one.
--
-- Times are bigint milliseconds since the Unix epoch (UTC), as in SQLite.

-- @migration 1
CREATE TABLE jobs (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  client_key        text UNIQUE,              -- idempotency key; NULL = none
  batch_id          text,                     -- group (e.g. one imported file)
  custom_id         text,                     -- OpenAI Batch custom_id, echoed on export
  model             text,                     -- model name the request asked for (informative)
  priority          bigint NOT NULL DEFAULT 0,    -- higher runs first
  prompt_kind       text NOT NULL DEFAULT 'text', -- 'text' | 'chat'
  prompt            text NOT NULL,            -- plain text, or a JSON array of chat messages
  max_tokens        bigint NOT NULL DEFAULT 256,
  temperature       double precision NOT NULL DEFAULT 1.0,
  top_p             double precision NOT NULL DEFAULT 1.0,
  top_k             bigint NOT NULL DEFAULT 0,    -- 0 = disabled
  seed              bigint,                   -- NULL = engine picks
  stop              text,                     -- JSON array of strings; NULL = none
  state             text NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  attempts          bigint NOT NULL DEFAULT 0,
  max_attempts      bigint NOT NULL DEFAULT 3,
  lease_owner       text,
  lease_expires_at  bigint,
  lease_token       bigint NOT NULL DEFAULT 0, -- fencing token: +1 at every claim
  error             text,
  enqueued_at       bigint NOT NULL
                    DEFAULT (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint,
  not_before        bigint NOT NULL DEFAULT 0, -- retry backoff: not claimed before this time
  started_at        bigint,
  first_token_at    bigint,
  finished_at       bigint,
  result_text       text,
  prompt_tokens     bigint,
  completion_tokens bigint,
  finish_reason     text,
  chat_template_kwargs text,                  -- chat jobs: JSON object of template variables
  payload_hash      text                      -- SHA-256 of the submitted job (queue submits only)
);
CREATE INDEX jobs_by_batch ON jobs (batch_id, id);
-- Claim order is priority then age; the partial index keeps the claim query off finished rows.
CREATE INDEX jobs_claim ON jobs (priority DESC, enqueued_at, id) WHERE state = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';

-- jobs.id belongs to the queue. GENERATED ALWAYS refuses an INSERT that names it (and any
-- UPDATE of it); a producer forcing one with OVERRIDING SYSTEM VALUE is refused here when the id
-- lies beyond what the identity sequence has handed out, since the queue would later collide
-- with it.
CREATE FUNCTION moebatch_jobs_id_is_assigned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id < 1 OR NEW.id > (SELECT last_value FROM jobs_id_seq) THEN
    RAISE EXCEPTION 'jobs.id is assigned by the queue: leave id out of the INSERT';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER jobs_id_is_assigned BEFORE INSERT ON jobs
  FOR EACH ROW EXECUTE FUNCTION moebatch_jobs_id_is_assigned();

-- Change notices: every statement that inserted or changed rows of jobs sends one NOTIFY on
-- channel moebatch_jobs at commit (several in one transaction are folded into one). A daemon
-- LISTENs and claims when another connection committed, as SQLite's data_version tells it.
-- Statements that matched no row send nothing, so idle daemons do not wake each other.
CREATE FUNCTION moebatch_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM changed) THEN
    PERFORM pg_notify('moebatch_jobs', '');
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobs REFERENCING NEW TABLE AS changed
  FOR EACH STATEMENT EXECUTE FUNCTION moebatch_jobs_notify();
CREATE TRIGGER jobs_notify_update AFTER UPDATE ON jobs REFERENCING NEW TABLE AS changed
  FOR EACH STATEMENT EXECUTE FUNCTION moebatch_jobs_notify();

-- One latency record per finished job, written by complete() in the same transaction.
CREATE TABLE job_latency (
  job_id         bigint PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
  queue_wait_ms  bigint NOT NULL,   -- enqueued -> started (last attempt)
  ttft_ms        bigint,            -- started -> first token
  decode_ms      bigint,            -- first token -> last token
  total_ms       bigint NOT NULL,   -- enqueued -> finished
  tokens_per_s   double precision,  -- completion tokens / decode time
  recorded_at    bigint NOT NULL
);

-- The OpenAI Files and Batch API (see schemas/jobs.sql, migration 4). seq gives the insertion
-- order that SQLite's rowid gives there (lists are newest first).
CREATE TABLE files (
  id          text PRIMARY KEY,          -- 'file-<hex>'
  seq         bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
  purpose     text NOT NULL,             -- 'batch' (uploaded) | 'batch_output' (written)
  filename    text NOT NULL,
  bytes       bigint NOT NULL,
  created_at  bigint NOT NULL,
  content     text NOT NULL
);
CREATE TABLE batches (
  id                 text PRIMARY KEY,   -- 'batch_<hex>'
  seq                bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
  input_file_id      text NOT NULL,
  endpoint           text NOT NULL,
  completion_window  text NOT NULL,
  metadata           text,               -- JSON object, NULL = none
  status             text NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress',
                       'finalizing', 'completed', 'expired', 'cancelling', 'cancelled')),
  total              bigint NOT NULL DEFAULT 0,
  errors             text,               -- JSON array of {code, message, line} when it failed
  output_file_id     text,
  error_file_id      text,
  created_at         bigint NOT NULL,
  in_progress_at     bigint,
  finalizing_at      bigint,
  completed_at       bigint,
  failed_at          bigint,
  cancelling_at      bigint,
  cancelled_at       bigint,
  expires_at         bigint
);
CREATE INDEX batches_open ON batches (status) WHERE status IN ('validating', 'in_progress',
  'cancelling');

-- @migration 2
-- The service's own tables (SQLite keeps them outside its migration list, created by the
-- daemon; see service/service_db.h). Times are ms since the epoch except
-- service_final_events.at, which is seconds (it only ages rows out).
CREATE TABLE service_cycles (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  worker       text NOT NULL,
  trigger      text NOT NULL CHECK (trigger IN ('schedule', 'request')),
  started_at   bigint NOT NULL,
  ended_at     bigint NOT NULL,
  downtime_ms  bigint NOT NULL,
  drained      bigint NOT NULL,
  requeued     bigint NOT NULL,
  mem_before   bigint NOT NULL,
  mem_after    bigint NOT NULL,
  warmup_ms    bigint NOT NULL,
  result       text NOT NULL CHECK (result IN ('ok', 'failed')),
  error        text
);
CREATE TABLE service_requests (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind          text NOT NULL CHECK (kind IN ('maintenance')),
  requested_at  bigint NOT NULL,
  taken_by      text,
  taken_at      bigint
);
-- A request is a change a daemon must notice: it takes requests when its data_version moves.
CREATE TRIGGER service_requests_notify AFTER INSERT ON service_requests
  REFERENCING NEW TABLE AS changed
  FOR EACH STATEMENT EXECUTE FUNCTION moebatch_jobs_notify();

-- The final-transition log. A reader keeps an "after id" cursor, which is only safe when ids
-- become visible in increasing order. A sequence alone does not give that (a transaction that
-- took id 7 may commit before the one that took id 6, and a reader at 7 would skip 6 for
-- good), so the trigger takes a transaction-scoped advisory lock before nextval: the next
-- finishing transaction waits until this one has committed (or rolled back), and ids commit in
-- order. Transactions that finish jobs are serialized by it from the trigger on to their commit;
-- the service commits results in groups, so this costs one short wait per group. The trigger
-- itself is created by the daemon (service/service_db_pg.cpp), so no rows pile up in a
-- database no daemon reads and prunes.
CREATE TABLE service_final_events (
  id      bigint PRIMARY KEY,
  job_id  bigint NOT NULL,
  state   text NOT NULL,
  at      bigint NOT NULL
);
CREATE SEQUENCE service_final_events_id_seq OWNED BY service_final_events.id;
CREATE FUNCTION moebatch_final_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- "moebatch-final-events" key: 7885632945765245801.
  PERFORM pg_advisory_xact_lock(7885632945765245801);
  INSERT INTO service_final_events (id, job_id, state, at)
  VALUES (nextval('service_final_events_id_seq'), NEW.id, NEW.state,
          floor(extract(epoch FROM clock_timestamp()))::bigint);
  RETURN NULL;
END $$;

-- @migration 3
-- As SQLite's migration 8: the OpenAI request fields `user` (end_user; `user` is reserved) and
-- `metadata` (a JSON object of string values), kept and returned but not used by the engine.
ALTER TABLE jobs ADD COLUMN end_user text;
ALTER TABLE jobs ADD COLUMN metadata text;

-- @migration 4
-- As SQLite's migration 9: failed and cancelled jobs by state, so the queue's counts
-- (JobStore::stats) read indexes only (done is every other row).
CREATE INDEX jobs_failed_or_cancelled ON jobs (state) WHERE state IN ('failed', 'cancelled');

-- @migration 5
-- As SQLite's migration 10: a file's content in pieces of at most 1 MiB, cut at UTF-8 character
-- boundaries, which a download reads one at a time. (Pieces of one text value by substr would
-- not do: on a multibyte database encoding substr reads the value from its start, so a
-- download would cost the square of the file's size.)
CREATE TABLE file_chunks (
  file_id  text NOT NULL,
  seq      bigint NOT NULL,
  data     text NOT NULL,
  PRIMARY KEY (file_id, seq)
);
INSERT INTO file_chunks (file_id, seq, data) SELECT id, 0, content FROM files WHERE content <> '';
ALTER TABLE files DROP COLUMN content;
