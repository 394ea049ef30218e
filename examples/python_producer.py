#!/usr/bin/env python3
"""A moebatch producer in Python: submit a batch, wait for it, print the results.

Needs python3-zmq (Debian: apt-get install python3-zmq) and the standard sqlite3 module; the
daemon runs as `moebatch serve --db jobs.db --model DIR --bind tcp://127.0.0.1:5555`.

    python3 examples/python_producer.py --endpoint tcp://127.0.0.1:5555 --db jobs.db \
        --batch report-2026-12-01 --jobs 10

Half the jobs go over ZeroMQ in one `submit` message (docs/zmq.md), the other half as plain SQL
INSERTs into the same database (schemas/README.md). Every job has a key derived from the batch,
so running the script again resubmits nothing: the ingress answers `created: false` for a known
key and `INSERT OR IGNORE` skips it. Then it reads the database until no job of the batch is
queued or running, prints one line per job, and exits 0 when every job is done (1 otherwise).
"""
import argparse
import json
import sqlite3
import sys
import time

import zmq


def zmq_request(endpoint, request, timeout_s=5.0, retries=3):
    """Lazy Pirate: a REQ socket; on a timeout, close it and resend on a fresh one. Resending a
    submit is safe because its jobs carry keys."""
    ctx = zmq.Context.instance()
    for _ in range(retries):
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_string(json.dumps(request))
        if sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            reply = json.loads(sock.recv_string())
            sock.close()
            if reply["ok"] or not reply["error"]["retryable"]:
                return reply
        else:
            sock.close()
        time.sleep(0.2)
    raise RuntimeError(f"no reply from {endpoint} after {retries} tries")


def submit_over_zmq(endpoint, batch, prompts, max_tokens):
    jobs = [{"prompt": p, "key": f"{batch}/zmq-{i}", "max_tokens": max_tokens, "temperature": 0}
            for i, p in enumerate(prompts)]
    reply = zmq_request(endpoint, {"v": 1, "cmd": "submit", "id": f"{batch}-submit",
                                   "batch_id": batch, "jobs": jobs})
    if not reply["ok"]:
        raise RuntimeError(f"submit refused: {reply['error']}")
    return sum(1 for j in reply["jobs"] if j["created"])


def submit_over_sql(db, batch, prompts, max_tokens):
    with db:  # one transaction
        rows = [(f"{batch}/sql-{i}", batch, p, max_tokens) for i, p in enumerate(prompts)]
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO jobs (client_key, batch_id, prompt, max_tokens, "
                       "temperature) VALUES (?, ?, ?, ?, 0)", rows)
        return db.total_changes - before


def wait_for_batch(db, batch, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (open_jobs,) = db.execute("SELECT count(*) FROM jobs WHERE batch_id = ? AND state IN "
                                  "('queued', 'running')", (batch,)).fetchone()
        if open_jobs == 0:
            return True
        time.sleep(0.2)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="the daemon's --bind endpoint")
    ap.add_argument("--db", required=True, help="the daemon's job database")
    ap.add_argument("--batch", required=True, help="batch id (keys derive from it)")
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for the batch")
    args = ap.parse_args()

    prompts = [f"Write one sentence about the number {i}." for i in range(args.jobs)]
    half = args.jobs // 2
    db = sqlite3.connect(args.db, timeout=10)  # waits up to 10 s for the daemon's write lock
    created = submit_over_zmq(args.endpoint, args.batch, prompts[:half], args.max_tokens)
    created += submit_over_sql(db, args.batch, prompts[half:], args.max_tokens)
    print(f"batch {args.batch}: {created} new job(s), {args.jobs - created} already known")

    if not wait_for_batch(db, args.batch, args.timeout):
        print(f"batch {args.batch}: not finished after {args.timeout} s", file=sys.stderr)
        return 1
    rows = db.execute("SELECT id, client_key, state, completion_tokens, result_text, error "
                      "FROM jobs WHERE batch_id = ? ORDER BY id", (args.batch,)).fetchall()
    for job_id, key, state, tokens, text, error in rows:
        detail = f"{tokens} tokens: {text!r}" if state == "done" else error
        print(f"{job_id:6} {key:32} {state:9} {detail}")
    failed = sum(1 for r in rows if r[2] != "done")
    print(f"batch {args.batch}: {len(rows) - failed} done, {failed} not done")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
