#!/usr/bin/env python3
"""The long crash test (outside CI; docs/reliability.md): `moebatch serve` on the demo model (CPU)
is killed with SIGKILL at random moments, CYCLES times, while three producers submit JOBS jobs
through plain SQL inserts (schemas/README.md), the CLI (`moebatch submit --db`) and ZeroMQ
(`moebatch submit --endpoint`, the Lazy-Pirate client). Every producer retries a job until it is
acknowledged (committed), under a unique key, so retries are idempotent. After the last cycle an
undisturbed daemon finishes the queue and the exactly-once audit runs:

  - every job exists once (one row per key, no row without a producer's key);
  - every job is final (done unless a reason says otherwise) and was made final once (one row in
    the daemon's final-transition log, service_final_events);
  - every done job has one result and one latency row; no latency row for another state;
  - no job is left leased (lease_owner / lease_expires_at NULL everywhere).

A shortened run: --kill-phase-s S (or SIGUSR1 to the script) ends the kill cycles and the
producers' new jobs after S seconds; jobs being retried still finish, so the audit covers exactly
the cycles run and the jobs acknowledged, which the summary reports.

Usage: scripts/crash_loop.py [--jobs 10000] [--cycles 200] [--bin build/moebatch] [--seed 1]
                             [--kill-phase-s S]
Exit 0 when the audit passes; the summary (and the failures) print at the end.
"""
import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10000, help="jobs in all (split over 3 producers)")
    p.add_argument("--cycles", type=int, default=200, help="SIGKILL cycles")
    p.add_argument("--bin", default=os.path.join(REPO, "build", "moebatch"))
    p.add_argument("--seed", type=int, default=1, help="kill timing and producer pacing")
    p.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
    p.add_argument("--max-tokens", type=int, default=2)
    p.add_argument("--uptime", type=float, nargs=2, default=(0.3, 3.0), metavar=("MIN", "MAX"),
                   help="seconds a daemon serves after it is ready, before the kill")
    p.add_argument("--zmq-workers", type=int, default=3, help="parallel ZeroMQ submitters")
    p.add_argument("--kill-phase-s", type=float, default=None,
                   help="end the kill cycles and new submissions after this many seconds")
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    def __init__(self, a, work):
        self.a, self.work = a, work
        self.db = os.path.join(work, "jobs.db")
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.env = dict(os.environ, MOEBATCH_CACHE=os.path.join(work, "cache"))
        self.lock = threading.Lock()
        self.acked = {}  # key -> producer
        self.errors = []
        self.retries = {"sql": 0, "cli": 0, "zmq": 0}
        self.model = None
        self.stop = threading.Event()  # kill phase over: no new cycle, no new job

    def producing(self):
        return not self.stop.is_set()

    def ack(self, key, producer):
        with self.lock:
            self.acked[key] = producer

    def fatal(self, msg):
        with self.lock:
            self.errors.append(msg)

    def prepare(self):
        # `moebatch demo` generates the demo model into $MOEBATCH_CACHE; its directory names the
        # architecture (the same steps as tests/gpu/service_e2e.sh).
        log = os.path.join(self.work, "demo.log")
        with open(log, "w") as f:
            rc = subprocess.call([self.a.bin, "demo", "--jobs", "2", "--max-tokens", "1",
                                  "--threads", "1"], stdout=f, stderr=f, env=self.env)
        if rc != 0:
            sys.exit(f"moebatch demo failed ({rc}); see {log}")
        cache = self.env["MOEBATCH_CACHE"]
        dirs = sorted(d for d in os.listdir(cache) if d.startswith("demo-qwen3moe-"))
        if not dirs:
            sys.exit(f"no demo model under {cache}")
        self.model = os.path.join(cache, dirs[0])
        # The schema exists before the first producer writes: the CLI creates it.
        subprocess.check_call([self.a.bin, "stats", "--db", self.db], env=self.env,
                              stdout=subprocess.DEVNULL)

    def serve(self, n):
        ready = os.path.join(self.work, "ready.json")
        if os.path.exists(ready):
            os.remove(ready)
        log = open(os.path.join(self.work, f"serve-{n % 10}.log"), "w")
        p = subprocess.Popen(
            [self.a.bin, "serve", "--db", self.db, "--model", self.model, "--bind", self.endpoint,
             "--http-port", "-1", "--ready-file", ready, "--max-num-seqs", "16",
             "--kv-cache-mb", "32", "--threads", "1", "--lease-s", "2", "--poll-ms", "20",
             "--warmup-seqs", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        deadline = time.time() + 120
        while not os.path.exists(ready):
            if p.poll() is not None or time.time() > deadline:
                p.kill()
                p.wait()
                sys.exit(f"serve {n} did not become ready (exit {p.returncode}); see {log.name}")
            time.sleep(0.02)
        return p

    # Producers: each job gets a unique key and is retried until acknowledged.
    def sql_producer(self, keys, rng):
        conn = sqlite3.connect(self.db, timeout=10, isolation_level=None)
        i = 0
        while i < len(keys) and self.producing():
            chunk = keys[i:i + rng.randint(1, 20)]
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO jobs (client_key, batch_id, prompt, max_tokens, temperature, "
                    "max_attempts) VALUES (?, 'sql', ?, ?, 0, 100)",
                    [(k, f"crash test {k}", self.a.max_tokens) for k in chunk])
                conn.execute("COMMIT")
            except sqlite3.OperationalError:  # locked past the timeout: nothing committed
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                with self.lock:
                    self.retries["sql"] += 1
                time.sleep(0.05)
                continue
            for k in chunk:
                self.ack(k, "sql")
            i += len(chunk)
            time.sleep(rng.uniform(0, 0.05))
        conn.close()

    def cli_submit(self, key, producer, extra):
        cmd = [self.a.bin, "submit", f"crash test {key}", "--key", key, "--batch", producer,
               "--max-tokens", str(self.a.max_tokens), "--temperature", "0",
               "--max-attempts", "100"] + extra
        while True:
            r = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True)
            if r.returncode == 0:
                self.ack(key, producer)
                return True
            if r.returncode == 2:  # refused as invalid or a key conflict: a bug, not a crash
                self.fatal(f"{producer} submit {key}: exit 2: {r.stderr.strip()[-300:]}")
                return False
            with self.lock:
                self.retries[producer] += 1
            time.sleep(0.1)

    def cli_producer(self, keys, rng):
        for k in keys:
            if not self.producing() or not self.cli_submit(k, "cli", ["--db", self.db]):
                return
            time.sleep(rng.uniform(0, 0.01))

    def zmq_producer(self, keys):
        flags = ["--endpoint", self.endpoint, "--timeout-ms", "1500", "--attempts", "2"]
        for k in keys:
            if not self.producing() or not self.cli_submit(k, "zmq", flags):
                return


def audit(db, acked):
    c = sqlite3.connect(db)
    q = lambda sql: c.execute(sql).fetchall()  # noqa: E731
    one = lambda sql: q(sql)[0][0]  # noqa: E731
    fails = []
    rows = {k: (i, s) for i, k, s in q("SELECT id, client_key, state FROM jobs")}
    missing = [k for k in acked if k not in rows]
    extra = [k for k in rows if k not in acked]
    if missing:
        fails.append(f"{len(missing)} acknowledged job(s) missing, e.g. {missing[:5]}")
    if extra:
        fails.append(f"{len(extra)} row(s) no producer acknowledged, e.g. {extra[:5]}")
    states = dict(q("SELECT state, count(*) FROM jobs GROUP BY state"))
    not_final = sum(n for s, n in states.items() if s not in ("done", "failed", "cancelled"))
    if not_final:
        fails.append(f"{not_final} job(s) not final: {states}")
    if states.get("failed"):
        some = q("SELECT id, error FROM jobs WHERE state = 'failed' LIMIT 5")
        fails.append(f"{states['failed']} job(s) failed, e.g. {some}")
    leased = one("SELECT count(*) FROM jobs WHERE lease_owner IS NOT NULL "
                 "OR lease_expires_at IS NOT NULL")
    if leased:
        fails.append(f"{leased} job(s) still leased")
    no_result = one("SELECT count(*) FROM jobs WHERE state = 'done' AND (result_text IS NULL "
                    "OR completion_tokens IS NULL OR finish_reason IS NULL)")
    if no_result:
        fails.append(f"{no_result} done job(s) without a result")
    lat = dict(q("SELECT j.state, count(*) FROM job_latency l JOIN jobs j ON j.id = l.job_id "
                 "GROUP BY j.state"))
    if lat.get("done", 0) != states.get("done", 0) or len(lat) > 1:
        fails.append(f"latency rows by job state {lat}, done jobs {states.get('done', 0)}")
    dup_lat = one("SELECT count(*) FROM (SELECT job_id FROM job_latency GROUP BY job_id "
                  "HAVING count(*) > 1)")
    if dup_lat:
        fails.append(f"{dup_lat} job(s) with several latency rows")
    finals = dict(q("SELECT n, count(*) FROM (SELECT count(*) AS n FROM service_final_events "
                    "GROUP BY job_id) GROUP BY n"))
    logged = sum(finals.values())
    if set(finals) - {1} or logged != len(rows):
        fails.append(f"final transitions per job {finals} over {len(rows)} jobs")
    attempts = q("SELECT max(attempts), avg(attempts) FROM jobs")[0]
    return fails, states, attempts


def main():
    a = parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="moebatch-crash-")
    os.makedirs(work, exist_ok=True)
    run = Run(a, work)
    rng = random.Random(a.seed)
    t0 = time.time()
    signal.signal(signal.SIGUSR1, lambda *_: run.stop.set())
    run.prepare()
    n = a.jobs // 3
    sql_keys = [f"sql-{i}" for i in range(a.jobs - 2 * n)]
    cli_keys = [f"cli-{i}" for i in range(n)]
    zmq_keys = [f"zmq-{i}" for i in range(n)]
    w = max(1, a.zmq_workers)
    producers = [
        threading.Thread(target=run.sql_producer, args=(sql_keys, random.Random(a.seed + 1))),
        threading.Thread(target=run.cli_producer, args=(cli_keys, random.Random(a.seed + 2))),
    ] + [threading.Thread(target=run.zmq_producer, args=(zmq_keys[i::w],)) for i in range(w)]
    for t in producers:
        t.start()
    killed_leased = 0
    cycles = 0
    for cycle in range(a.cycles):
        if a.kill_phase_s is not None and time.time() - t0 > a.kill_phase_s:
            run.stop.set()
        if run.stop.is_set():
            break
        p = run.serve(cycle)
        time.sleep(rng.uniform(*a.uptime))
        with sqlite3.connect(run.db, timeout=10) as c:
            running = "SELECT count(*) > 0 FROM jobs WHERE state = 'running'"
            killed_leased += c.execute(running).fetchone()[0]
        p.send_signal(signal.SIGKILL)
        p.wait()
        cycles += 1
        if (cycle + 1) % 10 == 0:
            with run.lock:
                acked = len(run.acked)
            print(f"cycle {cycle + 1}/{a.cycles}: {acked} acked, {time.time() - t0:.0f} s",
                  flush=True)
    # The last daemon runs undisturbed until the producers are done and every job is final.
    kill_phase = time.time() - t0
    p = run.serve(cycles)
    for t in producers:
        t.join()
    deadline = time.time() + 3600
    while time.time() < deadline:
        with sqlite3.connect(run.db, timeout=10) as c:
            unfinished = "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')"
            left = c.execute(unfinished).fetchone()[0]
        if left == 0:
            break
        time.sleep(1)
    p.send_signal(signal.SIGTERM)
    rc = p.wait()
    fails, states, attempts = audit(run.db, run.acked)
    if rc != 0:
        fails.append(f"the last daemon exited {rc} on SIGTERM")
    fails += run.errors
    print(json.dumps({
        "jobs": len(run.acked), "jobs_planned": a.jobs, "cycles": cycles,
        "cycles_planned": a.cycles, "kill_phase_seconds": round(kill_phase),
        "acked_by_producer": {pr: sum(1 for v in run.acked.values() if v == pr)
                              for pr in ("sql", "cli", "zmq")},
        "kills_with_running_jobs": killed_leased,
        "states": states, "max_attempts_used": attempts[0],
        "mean_attempts": round(attempts[1] or 0, 3), "producer_retries": run.retries,
        "seconds": round(time.time() - t0), "workdir": work}))
    for f in fails:
        print("FAIL:", f)
    print("audit:", "FAILED" if fails else "passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
