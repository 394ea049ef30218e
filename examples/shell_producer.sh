#!/usr/bin/env bash
# A moebatch producer in shell: the sqlite3 command-line tool inserts a batch into the daemon's
# job database, `moebatch batch wait` waits until no job of it is queued or running, then
# `moebatch export` writes the results as OpenAI Batch output lines. Needs sqlite3 (Debian: apt-get install sqlite3) and the
# moebatch binary ($MOEBATCH, else `moebatch` on PATH).
#
#   examples/shell_producer.sh jobs.db nightly-2026-12-01 prompts.txt > results.jsonl
#
# One job per line of the prompts file (a prompt is one line here; use the JSONL import,
# `moebatch submit --file`, for anything richer). Keys are "<batch>/line-<n>", so running it again
# inserts nothing new (INSERT OR IGNORE). Exit 0 when every job of the batch is done.
set -euo pipefail
db="$1" batch="$2" prompts="$3"
max_tokens="${MAX_TOKENS:-16}" timeout_s="${TIMEOUT_S:-120}"
moebatch="${MOEBATCH:-moebatch}"

# SQL string literal: single quotes doubled.
q() { printf "'%s'" "${1//\'/\'\'}"; }
# .timeout: wait up to 10 s for the daemon's write lock instead of failing at once.
sql() { sqlite3 -batch -cmd ".timeout 10000" "$db" "$@"; }

{
  echo "BEGIN;"
  n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    [ -z "$line" ] && continue
    echo "INSERT OR IGNORE INTO jobs (client_key, batch_id, prompt, max_tokens, temperature)" \
         "VALUES ($(q "$batch/line-$n"), $(q "$batch"), $(q "$line"), $max_tokens, 0);"
  done < "$prompts"
  echo "COMMIT;"
} | sql
echo "batch $batch: $(sql "SELECT count(*) FROM jobs WHERE batch_id = $(q "$batch")") job(s)" >&2

# batch wait exits 0 when every job is done, 1 when one failed or was cancelled or the timeout
# passed; its summary goes to stderr so that stdout holds only the results.
status=0
"$moebatch" batch wait --db "$db" "$batch" --timeout "$timeout_s" --interval-ms 200 >&2 ||
  status=$?
"$moebatch" export --db "$db" --batch "$batch"
not_done=$(sql "SELECT count(*) FROM jobs WHERE batch_id = $(q "$batch") AND state != 'done'")
echo "batch $batch: finished, $not_done job(s) not done" >&2
exit "$status"
