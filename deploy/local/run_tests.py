#!/usr/bin/env python3
"""Runs every test binary of the workspace, built already, two at a time.

usage: deploy/local/run_tests.py CARGO_ARGS... [-- TEST_ARGS...]

CARGO_ARGS select the build (`--profile ci --workspace --features ...`);
TEST_ARGS go to every test binary (`--test-threads 2`). `cargo test` runs
its test binaries one after another; most of inferlog's integration tests
wait on servers (a group rebalance, a merge, a daemon's poll), so two
binaries at a time use the two cores that one leaves idle.

A binary that stops or restarts a server (STOPS) never runs beside one
that needs that server (NEEDS; every server unless listed): the broker's
restart in kafka_broker runs beside the compactor's tests, not beside
ingest's. Binaries start longest first (LONGEST, measured), so the long
ones do not end up alone at the end. Each binary's output goes to
.inferlog/test-logs/NAME.log and is printed, whole and in cargo's format
(`Running ...`, then libtest's lines), when the binary ends, so two binaries'
lines never interleave.

INFERLOG_TEST_JOBS sets how many binaries run at once (default 2).
Exit status: 0 when every binary passed, else 1.
"""

import json
import os
import subprocess
import sys
import threading
import time

SERVERS = {"kafka", "clickhouse", "postgres", "s3"}
# Test binaries (tests/tests/NAME.rs) that stop, kill or restart a server.
STOPS = {
    # It stops and kills the cluster's own servers: nothing else using the cluster runs beside it.
    "cluster": {"cluster"},
    "e2e_faults": SERVERS,
    "kafka_broker": {"kafka"},
    "ingest_clickhouse_outage": {"clickhouse"},
    "compactor_s3_outage": {"s3"},
}
# The servers a test binary uses, where not all of them.
NEEDS = {
    "docs": set(),
    "kafka_broker": {"kafka", "clickhouse"},
    "compactor": {"clickhouse", "postgres", "s3"},
    "compactor_s3_outage": {"clickhouse", "postgres", "s3"},
    "report": {"clickhouse", "postgres", "s3"},
    "rollups": {"clickhouse", "postgres", "s3"},
    "sampling": {"clickhouse", "postgres", "s3"},
    # The local ClickHouse cluster (services.sh up --cluster), not the single server; its
    # tests stop and kill the cluster's own servers and ZooKeeper, which nothing else uses.
    "cluster": {"cluster", "kafka", "postgres", "s3"},
    **{name: {"kafka", "clickhouse"} for name in
       ["ingest", "ingest_crash", "ingest_dlq", "ingest_rebalance", "ingest_startup", "ingest_clickhouse_outage",
        "service_metrics", "otlp"]},
    # Its fault proxy stands in front of the shared ClickHouse; dlq replay's ledger is in Postgres.
    "fault_matrix": {"kafka", "clickhouse", "postgres", "cluster"},
}
# Seconds each took in a run on the 2-core machine kind (2026-12-06).
# Unit-test binaries (not listed) take under 1 s.
LONGEST = {
    "kafka_broker": 263, "cluster": 235, "fault_matrix": 200, "ingest_rebalance": 152, "ingest": 108,
    "ingest_clickhouse_outage": 100, "ingest_dlq": 100, "compactor_s3_outage": 90, "e2e_faults": 71,
    "sampling": 43, "kafka_security": 41, "report": 39, "retention": 38, "ingest_crash": 35, "e2e": 33,
    "otlp": 33, "ingest_startup": 28, "erase": 21, "compactor": 21, "service_metrics": 6, "rollups": 4,
}


def start_order(name):
    """The order binaries start in: those that stop a server first (what
    may run beside one is then still queued: the broker's two minutes
    beside the tests that need no broker), then the longest first. On
    the figures above: about 900 s of tests, against 1,030 s longest
    first only."""
    return (0 if name in STOPS else 1, -LONGEST.get(name, 0))


def needs(name):
    # Unit tests (`NAME (lib)`, `NAME (bin)`) use no server.
    return NEEDS.get(name, set() if "(" in name else SERVERS)


def fits(name, running):
    """Whether `name` may start beside the binaries `running`."""
    return all(not (STOPS.get(name, set()) & needs(r)) and not (STOPS.get(r, set()) & needs(name)) for r in running)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOGS = os.path.join(os.environ.get("INFERLOG_LOCAL_DIR", os.path.join(REPO, ".inferlog")), "test-logs")


def test_binaries(cargo_args):
    """(name, kind, path) of every test executable of the build."""
    out = subprocess.run(["cargo", "test", *cargo_args, "--no-run", "--message-format=json"],
                         cwd=REPO, check=True, stdout=subprocess.PIPE, text=True).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable") or not msg["profile"]["test"]:
            continue
        target = msg["target"]
        name = target["name"] if "test" in target["kind"] else f"{target['name']} ({target['kind'][0]})"
        found.append((name, target["kind"][0], msg["executable"]))
    return found


def run(name, path, test_args, results, lock):
    log = os.path.join(LOGS, name.replace(" ", "_").replace("(", "").replace(")", "") + ".log")
    start = time.monotonic()
    with open(log, "w") as f:
        code = subprocess.run([path, *test_args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    took = time.monotonic() - start
    summary = next((l.strip() for l in reversed(open(log).read().splitlines()) if l.startswith("test result:")), "no result line")
    with lock:
        results.append((name, code, took))
        print(f"     Running {os.path.relpath(path, REPO)} ({name})", flush=True)
        print(open(log).read(), flush=True)
        print(f"{'ok  ' if code == 0 else 'FAIL'} {name:<40} {took:7.1f} s  {summary}\n", flush=True)


def main():
    args = sys.argv[1:]
    split = args.index("--") if "--" in args else len(args)
    cargo_args, test_args = args[:split], args[split + 1:]
    os.makedirs(LOGS, exist_ok=True)
    binaries = sorted(test_binaries(cargo_args), key=lambda b: start_order(b[0]))
    jobs = int(os.environ.get("INFERLOG_TEST_JOBS", "2"))
    results, lock = [], threading.Lock()
    started = time.monotonic()
    print(f"{len(binaries)} test binaries, {jobs} at a time (never one that stops a server beside one that needs it)", flush=True)

    queue, running = list(binaries), set()
    changed = threading.Condition(lock)

    def worker():
        while True:
            with changed:
                while True:
                    if not queue:
                        return
                    pick = next((b for b in queue if fits(b[0], running)), None)
                    if pick is not None:
                        break
                    changed.wait()
                queue.remove(pick)
                running.add(pick[0])
            run(pick[0], pick[2], test_args, results, lock)
            with changed:
                running.discard(pick[0])
                changed.notify_all()

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Doc tests are not executables of the build: cargo runs them.
    start = time.monotonic()
    doc = subprocess.run(["cargo", "test", *cargo_args, "--doc", "--", *test_args], cwd=REPO).returncode
    results.append(("doc tests", doc, time.monotonic() - start))

    failed = [name for name, code, _ in results if code != 0]
    print(f"\n{len(results)} test runs in {time.monotonic() - started:.0f} s; the longest:")
    for name, code, took in sorted(results, key=lambda r: -r[2])[:8]:
        print(f"  {name:<40} {took:7.1f} s")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
