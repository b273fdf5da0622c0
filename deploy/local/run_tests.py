#!/usr/bin/env python3
"""Runs every test binary of the workspace, built already, two at a time.

usage: deploy/local/run_tests.py CARGO_ARGS... [-- TEST_ARGS...]

CARGO_ARGS select the build (`--profile ci --workspace --features ...`);
TEST_ARGS go to every test binary (`--test-threads 2`). `cargo test` runs
its test binaries one after another; most of inferlog's integration tests
wait on servers (a group rebalance, a merge, a daemon's poll), so two
binaries at a time use the two cores that one leaves idle. The binaries
that stop or restart a server (SERVER_FAULTS) run alone, after the others:
a broker restart would fail a neighbour's test. Each binary's output goes
to .inferlog/test-logs/NAME.log and is printed when it fails.

INFERLOG_TEST_JOBS sets how many binaries run at once (default 2).
Exit status: 0 when every binary passed, else 1.
"""

import json
import os
import subprocess
import sys
import threading
import time

# Test binaries (tests/tests/NAME.rs) that stop, kill or restart a server.
SERVER_FAULTS = {"e2e_faults", "kafka_broker", "ingest_clickhouse_outage", "compactor_s3_outage"}

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
        print(f"{'ok  ' if code == 0 else 'FAIL'} {name:<40} {took:7.1f} s  {summary}", flush=True)
        if code != 0:
            print(open(log).read(), flush=True)


def main():
    args = sys.argv[1:]
    split = args.index("--") if "--" in args else len(args)
    cargo_args, test_args = args[:split], args[split + 1:]
    os.makedirs(LOGS, exist_ok=True)
    binaries = test_binaries(cargo_args)
    shared = [b for b in binaries if b[0] not in SERVER_FAULTS]
    alone = [b for b in binaries if b[0] in SERVER_FAULTS]
    jobs = int(os.environ.get("INFERLOG_TEST_JOBS", "2"))
    results, lock = [], threading.Lock()
    started = time.monotonic()
    print(f"{len(shared)} test binaries, {jobs} at a time; then {len(alone)} that stop a server, one at a time", flush=True)

    queue = list(shared)
    def worker():
        while True:
            with lock:
                if not queue:
                    return
                name, _, path = queue.pop(0)
            run(name, path, test_args, results, lock)
    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, _, path in alone:
        run(name, path, test_args, results, lock)

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
