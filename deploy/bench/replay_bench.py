#!/usr/bin/env python3
"""The replay filter on a large history: what a partition's start costs when
a new consumer group reads a topic whose events are all stored already (a
group id changed, committed offsets lost), side by side for two builds.

Produces N generated events (all valid) to a fresh 8-partition topic and
ingests them once with this build (so the hot table and its replay log
hold every offset). Then, for each build named on the command line, runs
`inferlog-ingest --exit-when-idle` with a new group on that topic and table,
alternately, and reports per run:

  start_s    from the process start to the last partition's
             "replaying: skipping stored offsets" line (every partition's
             lookup done)
  run_s      the whole run (reading and skipping every message, exiting)
  peak_mb    the ingest process's peak RSS (VmHWM)

Needs `deploy/local/services.sh up` and release binaries. The topic and
table are kept, for another comparison with `--reuse TOPIC`.

  deploy/bench/replay_bench.py --events 10000000 --runs 3 BUILD_DIR [BUILD_DIR...]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CH = os.environ.get("INFERLOG_TEST_CLICKHOUSE_URL", "http://127.0.0.1:8123")
BROKERS = os.environ.get("INFERLOG_TEST_KAFKA_BROKERS", "127.0.0.1:9092")
KAFKATOOL = os.path.join(REPO, "deploy/local/kafkatool.py")
STAMP = re.compile(r"^(\S+Z)")


def clickhouse(sql):
    return subprocess.run(["curl", "-sS", "--fail-with-body", "--data-binary", sql, CH], check=True, capture_output=True, text=True).stdout.strip()


def config(work, topic, table, group):
    path = os.path.join(work, f"{group}.toml")
    with open(path, "w") as f:
        f.write(f'[kafka]\nbrokers = "{BROKERS}"\ntopics = ["{topic}"]\ngroup_id = "{group}"\ndlq_topic = "{topic}-dlq"\n\n'
                f'[clickhouse]\nurl = "{CH}"\ndatabase = "inferlog_bench"\ntable = "{table}"\nrejects_table = "{table}_rejects"\n\n'
                f'[ingest]\nmetrics_addr = ""\n')
    return path


def peak_rss(pid, out, done):
    while not done.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out[0] = max(out[0], int(line.split()[1]))
        except OSError:
            return
        time.sleep(0.05)


def run(bin_dir, cfg, key, log, replays_expected=True):
    env = dict(os.environ, INFERLOG_HASH_KEY_FILE=key)
    started = time.time()
    with open(log, "w") as err:
        proc = subprocess.Popen([os.path.join(bin_dir, "inferlog-ingest"), "--config", cfg, "--exit-when-idle", "5s"],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
        rss, done = [0], threading.Event()
        sampler = threading.Thread(target=peak_rss, args=(proc.pid, rss, done))
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
    elapsed = time.time() - started
    if code != 0:
        sys.exit(f"{bin_dir}: ingest exited {code}; see {log}")
    text = open(log).read()
    if not replays_expected:
        return {"run_s": round(elapsed, 2), "peak_mb": round(rss[0] / 1024, 1)}
    replays = [l for l in text.splitlines() if "replaying: skipping stored offsets" in l]
    if len(replays) != 8:
        sys.exit(f"{bin_dir}: {len(replays)} partitions replayed, expected 8; see {log}")
    stamp = lambda line: datetime.datetime.fromisoformat(STAMP.match(line).group(1)).timestamp()
    start_s = max(stamp(l) for l in replays) - started
    return {"start_s": round(start_s, 2), "run_s": round(elapsed, 2), "peak_mb": round(rss[0] / 1024, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--reuse", metavar="TOPIC", help="a topic (and its table, TOPIC with - as _) left by an earlier run: skip producing and storing it")
    p.add_argument("builds", nargs="+", help="directories holding inferlog-ingest")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="inferlog-replay-bench-")
    key = os.path.join(work, "hash.key")
    with open(key, "w") as f:
        f.write("replay-bench-hash-key-0123456789abcdef")
    run_id = uuid.uuid4().hex[:8]
    topic, table = f"replaybench-{run_id}", f"replaybench_{run_id}"
    if args.reuse:
        topic, table = args.reuse, args.reuse.replace("-", "_")
    else:
        produce_and_store(args, work, key, topic, table)
    measure(args, work, key, topic, table)


def produce_and_store(args, work, key, topic, table):
    subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "create-topics", "--partitions", "8", topic, f"{topic}-dlq"], check=True)
    events = os.path.join(work, "events.jsonl")
    with open(events, "wb") as f:
        subprocess.run([os.path.join(REPO, "target/release/inferlog-schema"), "generate", "--count", str(args.events), "--days", "3",
                        "--invalid-ratio", "0"], stdout=f, check=True)
    subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "produce", "--topic", topic, events], check=True, stdout=subprocess.DEVNULL)
    os.remove(events)
    # The history: every event stored once by this build.
    run(os.path.join(REPO, "target/release"), config(work, topic, table, f"{topic}-history"), key, os.path.join(work, "history.log"), False)


def measure(args, work, key, topic, table):
    rows = clickhouse(f"SELECT count() FROM inferlog_bench.{table}")
    results = {b: [] for b in args.builds}
    for i in range(args.runs):
        for b in args.builds:
            group = f"{topic}-{uuid.uuid4().hex[:8]}"
            results[b].append(run(b, config(work, topic, table, group), key, os.path.join(work, f"{group}.log")))
    summary = {"events": args.events, "hot_rows": int(rows), "builds": {}}
    for b, runs in results.items():
        summary["builds"][b] = {"runs": runs, "median": {k: statistics.median(r[k] for r in runs) for k in runs[0]}}
    print(json.dumps(summary, indent=2))
    print(f"kept for --reuse: topic {topic}, table inferlog_bench.{table}", file=sys.stderr)


if __name__ == "__main__":
    main()
