#!/usr/bin/env bash
# One command from a fresh machine to the main job: dependencies, build, `moebatch demo`, then
# the batch verbs on the demo's database: a batch's counts, waiting for it, and OpenAI's output
# and error files (docs/walkthrough.md walks through the same with your own file).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
mb=./"${BUILD_DIR:-build}"/moebatch
work="$(mktemp -d)"
db="$work/jobs.db"
"$mb" demo --db "$db" "$@"

echo
echo "== the batch verbs on the demo's database ($db) =="
echo "\$ moebatch batch status demo-zmq"
"$mb" batch status --db "$db" demo-zmq
echo "\$ moebatch batch wait demo-zmq   # exit 0: every job done"
"$mb" batch wait --db "$db" demo-zmq --no-progress > /dev/null && echo "exit 0"
echo "\$ moebatch export --batch demo-zmq -o output.jsonl --error-file errors.jsonl"
"$mb" export --db "$db" --batch demo-zmq -o "$work/output.jsonl" --error-file "$work/errors.jsonl"
echo "$(wc -l < "$work/output.jsonl") output line(s), $(wc -l < "$work/errors.jsonl") error" \
  "line(s) in $work; the first output line:"
head -n 1 "$work/output.jsonl" | cut -c 1-300
echo "\$ moebatch batch purge demo-sql"
"$mb" batch purge --db "$db" demo-sql
