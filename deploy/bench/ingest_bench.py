#!/usr/bin/env python3
"""Ingest throughput: inferlog-ingest against the glue a user would otherwise write.

Produces N generated events (all valid: the glue cannot survive malformed
JSON) to a fresh topic once, then, on that same data, times alternately:

  inferlog  inferlog-ingest (validate, normalize, hash, exactly-once, DLQ) into its hot table
  glue      a Python confluent-kafka consumer that POSTs batches of the raw JSON to
            ClickHouse's HTTP interface (INSERT ... FORMAT JSONEachRow, unknown
            fields skipped) and commits after each insert: no validation, no
            hashing, no DLQ, no exactly-once

Each run uses its own consumer group and table; the time is from process
start until the table holds all N rows (same clock for both). Prints per-run
figures and medians as JSON. Needs `deploy/local/services.sh up` and
release binaries (cargo build --release --bins).

  deploy/bench/ingest_bench.py [--events 200000] [--runs 3]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CH = os.environ.get("INFERLOG_TEST_CLICKHOUSE_URL", "http://127.0.0.1:8123")
BROKERS = os.environ.get("INFERLOG_TEST_KAFKA_BROKERS", "127.0.0.1:9092")
KAFKATOOL = os.path.join(REPO, "deploy/local/kafkatool.py")
BIN = os.path.join(REPO, "target/release")


def ch(sql):
    req = urllib.request.Request(CH, data=sql.encode(), method="POST")
    with urllib.request.urlopen(req) as r:
        return r.read().decode().strip()


def count(table):
    try:
        return int(ch(f"SELECT count() FROM {table}") or 0)
    except Exception:
        return 0


def wait_rows(proc, table, n, limit=900):
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if count(table) >= n:
            return
        if proc.poll() is not None and count(table) < n:
            raise SystemExit(f"{table}: process exited early with {proc.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"{table}: timed out")


GLUE = r'''
import json, sys, time, urllib.request
from confluent_kafka import Consumer
brokers, topic, group, table, ch = sys.argv[1:6]
c = Consumer({"bootstrap.servers": brokers, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe([topic])
idle_since = time.monotonic()
url = ch + "/?input_format_skip_unknown_fields=1&query=" + urllib.parse.quote(f"INSERT INTO {table} FORMAT JSONEachRow")
while time.monotonic() - idle_since < 10:
    msgs = c.consume(num_messages=10000, timeout=1.0)
    msgs = [m for m in msgs if m.error() is None]
    if not msgs:
        continue
    idle_since = time.monotonic()
    body = b"\n".join(m.value() for m in msgs)
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")).read()
    c.commit(asynchronous=False)
c.close()
'''


def run_glue(topic, n):
    table = f"inferlog_bench.glue_{uuid.uuid4().hex[:8]}"
    ch(f"""CREATE TABLE {table} (request_id String, model_name String, model_version String,
        business_line String, input_tokens UInt32, output_tokens UInt32, total_latency_ms Float64,
        error_code Int32, user_id String, queue_wait_ms Float64, prefill_time_ms Float64,
        decode_time_ms Float64) ENGINE = MergeTree ORDER BY (business_line, model_name, request_id)""")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", "import urllib.parse\n" + GLUE, BROKERS, topic,
                             f"glue-{uuid.uuid4().hex[:8]}", table, CH])
    wait_rows(proc, table, n)
    elapsed = time.monotonic() - start
    proc.terminate()
    proc.wait()
    return elapsed


def run_inferlog(topic, n, workdir):
    name = f"ingest_{uuid.uuid4().hex[:8]}"
    config = os.path.join(workdir, f"{name}.toml")
    with open(config, "w") as f:
        f.write(f'''[kafka]
brokers = "{BROKERS}"
topics = ["{topic}"]
group_id = "{name}"
dlq_topic = "{topic}-dlq"
[clickhouse]
url = "{CH}"
database = "inferlog_bench"
table = "{name}"
rejects_table = "{name}_rejects"
[ingest]
metrics_addr = ""
''')
    env = dict(os.environ, INFERLOG_HASH_KEY_FILE=os.path.join(workdir, "hash.key"))
    start = time.monotonic()
    proc = subprocess.Popen([os.path.join(BIN, "inferlog-ingest"), "--config", config, "--exit-when-idle", "5s"],
                            env=env, stderr=open(os.path.join(workdir, f"{name}.log"), "w"))
    wait_rows(proc, f"inferlog_bench.{name}", n)
    elapsed = time.monotonic() - start
    proc.wait()
    # ru_maxrss of waited-for children is the largest so far; the glue runs
    # in Python children too, so read it right after each ingest run.
    return elapsed, proc.returncode


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    ch("CREATE DATABASE IF NOT EXISTS inferlog_bench")
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "hash.key"), "w") as f:
            f.write("benchmark-hash-key-0123456789abcdef")
        events = os.path.join(workdir, "events.jsonl")
        with open(events, "wb") as f:
            subprocess.run([os.path.join(BIN, "inferlog-schema"), "generate", "--count", str(args.events),
                            "--days", "3", "--seed", "99"], stdout=f, check=True)
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "create-topics", "--partitions", "8",
                        topic, f"{topic}-dlq"], check=True)
        subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "produce", "--topic", topic, events],
                       check=True, stdout=subprocess.DEVNULL)
        results = {"events": args.events, "inferlog_s": [], "glue_s": [], "inferlog_peak_rss_mb": 0}
        for i in range(args.runs):
            elapsed, rc = run_inferlog(topic, args.events, workdir)
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            results["inferlog_peak_rss_mb"] = max(results["inferlog_peak_rss_mb"], round(peak, 1))
            results["inferlog_s"].append(round(elapsed, 2))
            results["glue_s"].append(round(run_glue(topic, args.events), 2))
            print(f"run {i + 1}: inferlog {elapsed:.2f}s (exit {rc}), glue {results['glue_s'][-1]:.2f}s", file=sys.stderr)
        inf = args.events / statistics.median(results["inferlog_s"])
        glue = args.events / statistics.median(results["glue_s"])
        results.update(inferlog_events_per_s=round(inf), glue_events_per_s=round(glue), ratio=round(inf / glue, 2))
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
